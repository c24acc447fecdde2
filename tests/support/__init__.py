"""What the tests share: tiny datasets and runs, the in-process CLI runner, dashboard and slide fixtures, image
bombs, run-file readers. ``tests`` is on pytest's ``pythonpath`` (pyproject.toml), so a test imports these as
``support.<module>`` wherever it sits."""
