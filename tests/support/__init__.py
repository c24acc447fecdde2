"""What the tests share: tiny datasets and runs, the in-process CLI runner, dashboard and slide fixtures, image
bombs, run-file readers, raw SEED/BOT slides for `prepare`, a fake paired ablation, a hospital driven message by
message (`trust`), and ``checks.every`` (an ``all()`` that fails on an empty input). ``tests`` is on pytest's
``pythonpath`` (pyproject.toml), so a test imports these as ``support.<module>`` wherever it sits."""
