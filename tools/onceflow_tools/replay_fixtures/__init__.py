"""Golden replay fixtures: histories recorded by the real engine, replayed by a unit test.

``tests/unit/test_replay_golden.py`` replays each history in ``tests/fixtures/replay/``
against today's workflow code, with a store that serves only that history: a change
of the engine (or of a workflow) that would break the replay of instances already in
the database fails a test there, before it reaches them (Temporal keeps such histories
in ``tests/worker/test_replayer_*.json``).

* :mod:`.workflows`: the ``golden-*`` workflows, each crossing a part of replay the
  samples (``onceflow_examples``) do not;
* :mod:`.record`: the scenarios and the recorder, run on the dev services only when a
  workflow they run changed on purpose (docs/architecture.md, "Golden replay
  fixtures")::

      eval "$(onceflow dev env)"
      python -m onceflow_tools.replay_fixtures record --out tests/fixtures/replay/
"""
