"""Version v1 of ``test-versioned`` with a patch: the charge step changed for new
instances only (``ctx.patched``); instances that already charged keep the old path."""

from workflow_engine import workflow

NAME = "test-versioned"


def effect(label: str) -> str:
    return label


@workflow(NAME, version="v1")
async def versioned(ctx, params):
    await ctx.step("reserve", effect, "reserved")
    if await ctx.patched("fix-charge"):
        charge = await ctx.step("charge-with-tax", effect, "charged-patched")
    else:
        charge = await ctx.step("charge", effect, "charged-v1")
    await ctx.wait_for_event("approval", type="approved")
    ship = await ctx.step("ship", effect, "shipped-v1")
    return {"path": "v1", "charge": charge, "ship": ship}
