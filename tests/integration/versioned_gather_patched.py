"""``test-versioned-gather`` v1 with ``ctx.patched`` inside the shorter gather branch:
refused (PatchedInBranch), since replay cannot tell an instance whose branch ended
there on the old code from one that has not reached it."""

from workflow_engine import workflow

NAME = "test-versioned-gather"


def effect(label: str) -> str:
    return label


@workflow(NAME, version="v1")
async def gathered(ctx, params):
    async def pack():
        out = [await ctx.step("pack", effect, "packed")]
        if await ctx.patched("insure"):
            out.append(await ctx.step("insure-parcel", effect, "insured"))
        return out

    async def prepare():
        return [await ctx.step(s, effect, s) for s in ("pick", "label", "weigh")]

    got = await ctx.gather(pack(), prepare())
    await ctx.wait_for_event("approval", type="approved")
    return {"path": "v1", "got": got}
