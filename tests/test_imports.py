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


def test_package_exports_resolve_lazily():
    import raypipe

    for name in raypipe.__all__:
        assert getattr(raypipe, name) is not None
