"""Version v2 of ``test-versioned``: a different path (what a new image would run)."""

from workflow_engine import workflow

NAME = "test-versioned"


def effect(label: str) -> str:
    return label


@workflow(NAME, version="v2")
async def versioned(ctx, params):
    await ctx.step("reserve", effect, "reserved")
    await ctx.wait_for_event("approval", type="approved")
    ship = await ctx.step("ship-express", effect, "shipped-v2")
    return {"path": "v2", "ship": ship}
