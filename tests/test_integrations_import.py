"""flashsplit imports without transformers: the integrations import their library only when used.

Runs whether or not transformers is installed: a fresh interpreter hides it behind a meta-path
finder (any ``transformers`` or ``transformers.*`` import fails as if it were not installed),
then imports flashsplit and its integrations and calls ``register()``.
"""

import os
import subprocess
import sys

HIDE_AND_IMPORT = """
import importlib.abc
import sys


class HideTransformers(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "transformers" or name.startswith("transformers."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, HideTransformers())
try:
    import transformers  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("the finder did not hide transformers")

import flashsplit
import flashsplit.integrations
import flashsplit.integrations.mask_rows
import flashsplit.integrations.transformers as fs_transformers
import flashsplit.integrations.transformers_paged

loaded = sorted(name for name in sys.modules if name.split(".")[0] == "transformers")
assert not loaded, loaded
assert callable(flashsplit.decode) and fs_transformers.DEFAULT_NAME == "split_kv"
try:
    fs_transformers.register()
except ImportError as error:
    print("ImportError:", error)
else:
    raise SystemExit("register() ran without transformers")
"""


def test_flashsplit_and_its_integrations_import_without_transformers():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path))
    done = subprocess.run([sys.executable, "-c", HIDE_AND_IMPORT], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ImportError: flashsplit.integrations.transformers needs transformers" in done.stdout
    assert "pip install 'flashsplit[transformers]'" in done.stdout
