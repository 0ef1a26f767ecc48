"""Version v1 of ``test-versioned``, loaded by subprocess engines in test_versioning.py
(``ONCEFLOW_WORKFLOW_MODULES``): reserve, charge, wait for approval, ship."""

from workflow_engine import workflow

NAME = "test-versioned"


def effect(label: str) -> str:
    return label


@workflow(NAME, version="v1")
async def versioned(ctx, params):
    await ctx.step("reserve", effect, "reserved")
    charge = await ctx.step("charge", effect, "charged-v1")
    await ctx.wait_for_event("approval", type="approved")
    ship = await ctx.step("ship", effect, "shipped-v1")
    return {"path": "v1", "charge": charge, "ship": ship}
