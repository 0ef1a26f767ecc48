"""``python -m onceflow_tools.replay_fixtures record --out tests/fixtures/replay/``."""

from onceflow_tools.replay_fixtures.record import main

main()
