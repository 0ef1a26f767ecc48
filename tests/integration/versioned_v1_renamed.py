"""``test-versioned`` changed WITHOUT a new version or a patch (a step renamed): replay
of an instance that already ran the old step must stop it, not run anything again."""

from workflow_engine import workflow

NAME = "test-versioned"


def effect(label: str) -> str:
    return label


@workflow(NAME, version="v1")
async def versioned(ctx, params):
    await ctx.step("reserve", effect, "reserved")
    charge = await ctx.step("charge-card", effect, "charged-renamed")
    await ctx.wait_for_event("approval", type="approved")
    ship = await ctx.step("ship", effect, "shipped-v1")
    return {"path": "v1", "charge": charge, "ship": ship}
