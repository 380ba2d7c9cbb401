"""Import boundaries: kernels never import Ray; the augmentation stage (what Ray workers import) pulls
in neither torch nor timm, so worker processes start fast and stay small."""

import subprocess
import sys


def _loaded_after(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_kernels_do_not_import_ray():
    loaded = _loaded_after("raypipe.kernels")
    assert "ray" not in loaded


def test_stage_imports_neither_torch_nor_timm():
    loaded = _loaded_after("raypipe.stages.augment")
    assert not {"torch", "timm", "ray.train"} & loaded


def test_the_ray_data_transform_imports_neither_torch_nor_timm():
    """Ray Data's actors import the transform's module (and so ``raypipe.integrations``) only."""
    loaded = _loaded_after("raypipe.integrations.ray_data")
    assert not {"torch", "timm", "ray.train"} & loaded


def test_package_exports_resolve_lazily():
    import raypipe

    for name in raypipe.__all__:
        assert getattr(raypipe, name) is not None


# Three policies on one image, 40 seeds each, hashed: run in a fresh process and in this one.
_POLICY_DIGEST = """
import hashlib
import numpy as np
from raypipe.kernels import autoaug
img = np.random.default_rng(3).integers(0, 256, (64, 80, 3), dtype=np.uint8)
h = hashlib.sha256()
for policy in ("rand-m9-mstd0.5-inc1", "original", "augmix-m5-w3-d2"):
    op = autoaug.build_auto_augment(policy, (64, 80), (0.485, 0.456, 0.406), "random")
    for seed in range(40):
        h.update(autoaug.apply_auto_augment(op, img, seed).tobytes())
digest = h.hexdigest()
"""


def test_auto_augment_policies_run_without_importing_torch_and_match_timms_module():
    """Workers with a policy load timm's auto_augment module alone (no torch: ~3 s and ~600 MB less
    per worker); its images equal those of the module imported through the timm package."""
    code = _POLICY_DIGEST + (
        "import sys\n"
        "print(digest, 'torch' in sys.modules, 'timm' in sys.modules, autoaug.timm_auto_augment().__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    digest, torch_loaded, timm_loaded, module_name = out
    assert (torch_loaded, timm_loaded) == ("False", "False")
    assert module_name == "raypipe._timm_auto_augment"

    import timm.data.auto_augment  # noqa: F401 - the package's module, as a user's process has it

    from raypipe.kernels import autoaug

    autoaug.timm_auto_augment.cache_clear()
    try:
        assert autoaug.timm_auto_augment().__name__ == "timm.data.auto_augment"
        here: dict = {}
        exec(_POLICY_DIGEST, here)  # noqa: S102 - this file's own code
        assert here["digest"] == digest
    finally:
        autoaug.timm_auto_augment.cache_clear()


def test_a_listing_and_its_columns_do_not_import_pandas(sample_dir):
    """pyarrow's ``pa.array`` and ``to_numpy`` import pandas on first use (a quarter of a second before
    a run's first batch); listing a folder, its digest and split keys, and the columns a chunk's rows are
    taken from go through the tables' buffers instead."""
    code = (
        "import sys\n"
        "from raypipe.sources import open_source\n"
        "from raypipe.sources.table import TableColumns, table_columns\n"
        f"rows = open_source({str(sample_dir)!r})\n"
        "rows.digest(); rows.split_keys(); rows.num_classes; table_columns(rows.table)\n"
        "TableColumns(rows.table).take([1, 0])\n"
        "print(len(rows), 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert int(out[0]) > 0 and out[1] == "False"
