"""Fixtures of every test: the shared ones live in modules, registered here."""

pytest_plugins = ("tests.support.fixtures", "tests.fakes.receiver")
