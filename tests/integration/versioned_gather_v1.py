"""Version v1 of ``test-versioned-gather``, loaded by subprocess engines in
test_patched_gather.py: a gather whose first branch is shorter, then an approval."""

from workflow_engine import workflow

NAME = "test-versioned-gather"


def effect(label: str) -> str:
    return label


@workflow(NAME, version="v1")
async def gathered(ctx, params):
    async def pack():
        return [await ctx.step("pack", effect, "packed")]

    async def prepare():
        return [await ctx.step(s, effect, s) for s in ("pick", "label", "weigh")]

    got = await ctx.gather(pack(), prepare())
    await ctx.wait_for_event("approval", type="approved")
    return {"path": "v1", "got": got}
