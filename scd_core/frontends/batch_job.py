"""`python -m scd_core batch`: many images from a JOBS.jsonl file into a folder, resumable, here or on Ray.

    python -m scd_core batch jobs.jsonl --model demo --out out/ --seeds 0,1,2
    python -m scd_core batch jobs.jsonl --model /models/Janus-Pro-7B --out out/ --ray auto --gpus-per-worker 1

A JOBS.jsonl line is {"id": "...", "prompt": "...", "negative_prompt": "..." (optional), "seed": 7 (optional)}.
Image (id, seed) goes to OUT/{id}-s{seed}.png (a temporary file, then a rename) and only then gets its line in
OUT/manifest.jsonl.  OUT/run.json holds the model and sampler settings: a rerun skips what is in place, and a
run with other settings is refused.  The workers (a `Renderer` in this process, or Ray actors holding one each)
send back PNG bytes and stats; only this process writes to OUT, so a Ray cluster needs no shared disk.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import os
import re
import sys
from contextlib import closing
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from time import perf_counter
from typing import Any, Iterable, Iterator, Optional, Sequence, TextIO

import torch
from PIL import Image
from tqdm import tqdm

from ..jobs.batching import generate_many
from .cli_shared import (DEFAULTS, add_model_arguments, add_sampler_arguments, check_device, check_image_size,
                         decoder_settings, open_model, positive_int, sampler_config, to_pil)
from ..decoding.config import MAX_SEED, SamplerConfig
from ..decoding.engine import GenerationResult, generate
from ..models.weights.checkpoints import ModelLoadError

EXIT_FAILED = 1  # some images could not be made; the rest are in place
RUN_FILE, MANIFEST = "run.json", "manifest.jsonl"
JOB_KEYS = ("id", "prompt", "negative_prompt", "seed")
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")  # a plain file name, with room for "-s{seed}.png"
TEMP_SUFFIX = ".partial"
BATCH_PER_SLOT = 4  # jobs a Ray worker takes at once, per slot: enough to refill its slots, few to redo
FAILURES_LISTED = 20
MAX_SEEDS = 10_000  # --seeds: a range typed by mistake (0-99999999) stops here, not in memory
RAY_EXTRA = "pip install 'ray[data]>=2.60,<2.64'"

# What a worker sends back per job: the job's file name (its key), its manifest record, the PNG (b"" if failed).
Rendered = tuple[str, dict, bytes]


# ---------------------------------------------------------------- arguments

def seed_list(text: str) -> tuple[int, ...]:
    """--seeds: "0,1,2", "0-7" (0 to 7) or both ("0-3,9"); `generate --compare` and `batch` read it alike."""
    try:
        ranges = [_seed_range(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be seeds separated by commas, or a range: 0,1,2 or 0-7; "
                                         f"got {text!r}") from None
    if sum(seeds.stop - seeds.start for seeds in ranges) > MAX_SEEDS:  # len() overflows past 2**63
        raise argparse.ArgumentTypeError(f"at most {MAX_SEEDS} seeds, got {text!r}")
    seeds = tuple(seed for seeds in ranges for seed in seeds)
    if not all(0 <= seed <= MAX_SEED for seed in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"must be distinct integers in 0..{MAX_SEED}, got {text!r}")
    return seeds


def _seed_range(part: str) -> range:
    first, dash, last = part.partition("-")
    seeds = range(int(first), int(last if dash else first) + 1)
    if not seeds:
        raise ValueError(f"empty range {part}")
    return seeds


def gpu_count(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number of GPUs >= 0 (0.5: two workers per GPU), got {text}")
    return value


def add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("jobs", type=Path, metavar="JOBS.jsonl",
                        help='one job a line: {"id": "...", "prompt": "...", "negative_prompt": "..." (optional), '
                             '"seed": 7 (optional)}')
    add_model_arguments(parser.add_argument_group("model"))
    sampler = add_sampler_arguments(parser)
    sampler.add_argument("--seeds", type=seed_list, default=(DEFAULTS.seed,),
                         help="one image per seed (0,1,2 or 0-7) for each line without a seed of its own "
                              "(default: 0)")
    sampler.add_argument("--slots", type=positive_int, default=8,
                         help="jobs each worker keeps in flight at once (default 8)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="folder for the images, manifest.jsonl and run.json; rerun to resume")
    ray = parser.add_argument_group(f"Ray (optional: {RAY_EXTRA})")
    ray.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS|local",
                     help="run on Ray Data: local (the default value) starts a cluster on this machine, "
                          "auto or host:port joins a running one")
    ray.add_argument("--workers", type=positive_int,
                     help="worker actors, each loading the model once (default: the cluster's GPUs / "
                          "--gpus-per-worker, else 1)")
    ray.add_argument("--gpus-per-worker", type=gpu_count,
                     help="GPUs each worker requests (default: 1 when the cluster has GPUs, else 0)")


# ---------------------------------------------------------------- jobs

@dataclass(frozen=True)
class Job:
    line: int
    id: str
    seed: int
    prompt: str
    negative_prompt: Optional[str] = None

    @property
    def file(self) -> str:
        return image_file(self.id, self.seed)


def image_file(job_id: str, seed: int) -> str:
    return f"{job_id}-s{seed}.png"


def record(line: int, job_id: Optional[str], seed: Optional[int], error: Optional[str] = None,
           nfe: Optional[int] = None, seconds: Optional[float] = None) -> dict:
    """A manifest line: an image in place (no error) or a job that failed."""
    done = error is None
    entry = {"id": job_id, "seed": seed, "line": line,
             "file": image_file(job_id, seed) if done else None, "nfe": nfe,
             "seconds": None if seconds is None else round(seconds, 3), "status": "ok" if done else "failed"}
    return entry if done else {**entry, "error": error}


def logged_line(entry: dict, done: int, total: int) -> str:
    """The line an image prints when it arrives where no progress bar draws (a log)."""
    what = (f"{entry['file']}: {entry['nfe']} model calls, {entry['seconds']:.1f} s" if entry["status"] == "ok"
            else f"line {entry['line']} failed: {entry['error']}")
    return f"batch: {what} ({done} of {total})"


def parse_line(text: str, seeds: Sequence[int]) -> tuple[str, list[int], str, Optional[str]]:
    """(id, seeds, prompt, negative prompt) of one JOBS line; ValueError saying what is wrong with it."""
    try:
        entry = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err})") from None
    if not isinstance(entry, dict):
        raise ValueError(f"not a JSON object: {text.strip()[:60]}")
    unknown = sorted(set(entry) - set(JOB_KEYS))
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (a line has {', '.join(JOB_KEYS)})")
    job_id = entry.get("id")
    if isinstance(job_id, int) and not isinstance(job_id, bool):
        job_id = str(job_id)
    if not isinstance(job_id, str) or not ID_PATTERN.fullmatch(job_id):
        raise ValueError(f"id must be letters, digits and . _ + - (not first), up to 200, got {job_id!r}")
    prompt, negative = entry.get("prompt"), entry.get("negative_prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"prompt must be a non-empty string, got {prompt!r}")
    if negative is not None and not isinstance(negative, str):
        raise ValueError(f"negative_prompt must be a string, got {negative!r}")
    seed = entry.get("seed")
    if seed is None:
        return job_id, list(seeds), prompt, negative
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be an integer in 0..{MAX_SEED}, got {seed!r}")
    return job_id, [seed], prompt, negative


def jobs_text(path: Path) -> str:
    """The jobs file's text; one that is missing or unreadable is a one-line ValueError naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"jobs file {path} does not exist") from None
    except OSError as err:  # a folder, no permission
        raise ValueError(f"jobs file {path} cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"jobs file {path} is not UTF-8 text (byte {err.start})") from None


def read_jobs(path: Path, seeds: Sequence[int]) -> tuple[list[Job], list[dict]]:
    """The images JOBS.jsonl asks for, and a failed manifest record per line that cannot be run."""
    jobs: list[Job] = []
    bad: list[dict] = []
    seen: dict[str, int] = {}
    for line, text in enumerate(jobs_text(path).splitlines(), start=1):
        if not text.strip():
            continue
        try:
            job_id, line_seeds, prompt, negative = parse_line(text, seeds)
        except ValueError as err:
            bad.append(record(line, None, None, str(err)))
            continue
        for seed in line_seeds:
            job = Job(line, job_id, seed, prompt, negative)
            key = job.file.lower()  # some file systems ignore case: "A" and "a" would share a file
            if key in seen:
                bad.append(record(line, job_id, seed, f"id {job_id!r} with seed {seed} is line {seen[key]} "
                                                      f"already (ids differing only in case count as one)"))
            else:
                seen[key] = line
                jobs.append(job)
    if not jobs and not bad:
        raise ValueError(f"{path} holds no jobs")
    return jobs, bad


# ---------------------------------------------------------------- the output folder

def run_settings(args: argparse.Namespace, config: SamplerConfig) -> dict:
    """What makes an image what it is, as run.json records it (the seed is each image's own)."""
    model = "demo" if args.model == "demo" else str(Path(args.model).expanduser().resolve())
    sampler = {name: value for name, value in asdict(config).items() if name != "seed"}
    settings = {"model": model, "dtype": args.dtype, "quantize": args.quantize, "compile": args.compile,
                "width": args.width, "height": args.height, "sampler": sampler}
    decoding = decoder_settings(args)
    if decoding:  # only when given, so that the run.json of a batch started before these existed still resumes
        settings["decoder"] = decoding
    return settings


def flat(settings: dict) -> dict:
    """run.json's settings one level deep ("sampler.window"), to name what changed."""
    items = {}
    for key, value in settings.items():
        items.update({f"{key}.{name}": inner for name, inner in value.items()} if isinstance(value, dict)
                     else {key: value})
    return items


def png_in_place(path: Path) -> bool:
    """The PNG is there and reads to its end (a cut-off file fails its chunk checks or its pixel data)."""
    try:
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            image.load()
        return True
    except (OSError, SyntaxError, ValueError):  # PIL raises SyntaxError for a broken chunk
        return False


def write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + TEMP_SUFFIX)
    with open(partial, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


class OutFolder:
    """DIR: its settings checked against run.json, the images in place, and the manifest appended to.

    Nothing is written until the first result arrives, so a run that fails to start leaves DIR as it was.
    """

    def __init__(self, path: Path, settings: dict) -> None:
        self.path, self.settings = path, settings
        self.done: dict[str, dict] = {}  # file name -> manifest record of the images in place
        self._manifest: Optional[TextIO] = None
        run_file = path / RUN_FILE
        if not run_file.is_file():
            return  # a new run: the manifest starts empty
        try:
            recorded = json.loads(run_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            recorded = f"not JSON ({err})"
        if not isinstance(recorded, dict):
            raise ValueError(f"{run_file} is not a run's settings ({recorded!r:.80}); remove it to start "
                             f"{path} afresh")
        if recorded != settings:
            was, now = flat(recorded), flat(settings)
            changed = [f"{key} {was.get(key)!r} there, {now.get(key)!r} now"
                       for key in sorted(set(was) | set(now)) if was.get(key) != now.get(key)]
            raise ValueError(f"{path} holds images made with other settings ({'; '.join(changed)}): run with "
                             f"those settings to resume, or give another --out")
        self.done = self._images_in_place()

    def _images_in_place(self) -> dict[str, dict]:
        """The manifest's images whose files are whole; the lines of failures and of lost files are dropped."""
        done = {}
        manifest = self.path / MANIFEST
        lines = manifest.read_text(encoding="utf-8").splitlines() if manifest.is_file() else []
        for text in lines:
            try:
                entry = json.loads(text)
            except json.JSONDecodeError:  # a line cut off when the run was killed
                continue
            name = entry.get("file") if isinstance(entry, dict) and entry.get("status") == "ok" else None
            if isinstance(name, str) and name not in done and png_in_place(self.path / name):
                done[name] = entry
        return done

    def _open(self) -> TextIO:
        if self._manifest is None:
            self.path.mkdir(parents=True, exist_ok=True)
            for partial in self.path.glob(f"*{TEMP_SUFFIX}"):  # left by a killed run
                partial.unlink()
            write_atomically(self.path / RUN_FILE, (json.dumps(self.settings, indent=1) + "\n").encode())
            kept = "".join(json.dumps(entry) + "\n" for entry in self.done.values())
            write_atomically(self.path / MANIFEST, kept.encode())
            self._manifest = open(self.path / MANIFEST, "a", encoding="utf-8")
        return self._manifest

    def add(self, entry: dict, png: bytes = b"") -> None:
        """Put an image in place, then its manifest line (a failure: the line only)."""
        manifest = self._open()
        if entry["status"] == "ok":
            write_atomically(self.path / entry["file"], png)
            self.done[entry["file"]] = entry
        manifest.write(json.dumps(entry) + "\n")
        manifest.flush()
        os.fsync(manifest.fileno())

    def close(self) -> None:
        if self._manifest is not None:
            self._manifest.close()


# ---------------------------------------------------------------- workers

def png_bytes(model: Any, tokens: torch.Tensor) -> bytes:
    """One image's PNG, the same bytes wherever it is made (a loaded model decodes each image alone on one CPU
    thread: `models.pixels`), saved without a timestamp."""
    images = model.decode(tokens)
    buffer = io.BytesIO()
    to_pil(images).save(buffer, format="PNG")
    return buffer.getvalue()


def failure(job: Job, err: BaseException) -> Rendered:
    return job.file, record(job.line, job.id, job.seed, f"{type(err).__name__}: {err}"), b""


class Renderer:
    """One worker: a model; jobs in, (file, record, PNG) out as each job finishes."""

    def __init__(self, model: Any, config: SamplerConfig, slots: int) -> None:
        self.model, self.config, self.slots = model, config, slots

    @classmethod
    def load(cls, settings: dict, device: Optional[str], slots: int, offload_stages: bool = False) -> "Renderer":
        """The renderer of run.json's settings, its model loaded once (on `device`, its stages apart with
        `offload_stages`: how it runs, not what it makes, so run.json does not record them)."""
        model = open_model(settings["model"], device, settings["dtype"], settings["quantize"], settings["width"],
                           settings["height"], settings["compile"], settings.get("decoder"), offload_stages)
        return cls(model, SamplerConfig(**settings["sampler"]), slots)

    def render(self, jobs: Iterable[Job]) -> Iterator[Rendered]:
        """Each job's result as it finishes; a prompt is encoded when generate_many takes its job."""
        remaining = iter(jobs)
        while True:
            taken: list[tuple[Job, Any]] = []  # the jobs this stream took, at their index in it
            unencodable: list[Rendered] = []
            finished: set[int] = set()

            def encoded() -> Iterator[tuple[Any, int]]:
                for job in remaining:
                    try:  # an unknown class or a prompt the model cannot encode fails that job only
                        cond = self.model.encode(job.prompt, job.negative_prompt)
                    except Exception as err:
                        unencodable.append(failure(job, err))
                        continue
                    taken.append((job, cond))
                    yield cond, job.seed

            try:
                for index, result in generate_many(self.model, encoded(), self.config, slots=self.slots):
                    job = taken[index][0]
                    yield self._finish(job, result)
                    finished.add(index)
                    taken[index] = (job, None)  # its conditioning is no longer needed
                    yield from take_all(unencodable)
                yield from take_all(unencodable)
                return
            except Exception:
                yield from take_all(unencodable)
                unfinished = [item for index, item in enumerate(taken) if index not in finished]
                if not unfinished:
                    raise  # no job's doing
                # the stream does not say whose job broke it: the ones it held run alone, then the rest goes on
                for job, cond in unfinished:
                    yield self._alone(job, cond)

    def _finish(self, job: Job, result: GenerationResult) -> Rendered:
        started = perf_counter()
        png = png_bytes(self.model, result.tokens)
        seconds = result.total_s + perf_counter() - started
        return job.file, record(job.line, job.id, job.seed, nfe=result.nfe, seconds=seconds), png

    def _alone(self, job: Job, cond: Any) -> Rendered:
        try:  # generate_many's contract: a job's tokens are generate's with the job's seed
            return self._finish(job, generate(self.model, cond, replace(self.config, seed=job.seed)))
        except Exception as err:
            return failure(job, err)


def take_all(items: list) -> list:
    """The items, leaving the list empty."""
    taken = items[:]
    items.clear()
    return taken


class RayWorker:
    """A Ray Data actor: a Renderer; its batches of jobs (JSON) become rows of results, one row per image."""

    def __init__(self, settings: dict, device: Optional[str], slots: int, offload_stages: bool) -> None:
        self.renderer = Renderer.load(settings, device, slots, offload_stages)

    def __call__(self, batch: dict) -> Iterator[dict]:
        jobs = [Job(**json.loads(text)) for text in batch["job"]]
        for file, entry, png in self.renderer.render(jobs):
            yield {"file": [file], "record": [json.dumps(entry)], "png": [png]}


def ray_cluster_arguments(address: str) -> dict:
    """ray.init's arguments: `local` starts a new cluster bound to this machine's loopback, anything else joins."""
    if address == "local":
        return {"address": "local", "_node_ip_address": "127.0.0.1", "include_dashboard": False}
    return {"address": address}


def render_on_ray(args: argparse.Namespace, settings: dict, jobs: Sequence[Job]) -> Iterator[Rendered]:
    """The jobs over a pool of Ray actors; each result comes back here as soon as its image is done."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise ValueError(f"--ray needs Ray Data: {RAY_EXTRA}") from None
    started_here = not ray.is_initialized()
    if started_here:
        # py_modules: every node runs this copy of scd_core (torch and the rest must be installed there)
        ray.init(**ray_cluster_arguments(args.ray), logging_level=logging.WARNING,
                 runtime_env={"py_modules": [str(Path(__file__).parent)]})
    try:
        gpus = args.gpus_per_worker
        if gpus is None:
            gpus = 1.0 if ray.cluster_resources().get("GPU", 0) else 0.0
        workers = args.workers or (max(1, int(ray.cluster_resources().get("GPU", 0) // gpus)) if gpus else 1)
        logging.getLogger("ray.data").setLevel(logging.ERROR)  # the command's own bar and summary say it
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.target_max_block_size = 1  # a block per image: each result streams back once it is done
        per_task = max(1, min(BATCH_PER_SLOT * args.slots, math.ceil(len(jobs) / workers)))
        rows = ray.data.from_items([{"job": json.dumps(asdict(job))} for job in jobs])
        results = rows.map_batches(
            RayWorker, fn_constructor_kwargs={"settings": settings, "device": args.device, "slots": args.slots,
                                              "offload_stages": args.offload_stages},
            compute=ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1),
            num_gpus=gpus, batch_size=per_task)
        for row in results.iter_rows():
            yield row["file"], json.loads(row["record"]), bytes(row["png"])
    except ray.exceptions.ActorDiedError as err:  # a worker that fails to start fails the run at once
        cause = str(err).strip().splitlines()[-1]
        raise ModelLoadError(f"a Ray worker could not start ({cause}); is the model folder at the same path "
                             f"on every node?") from None
    finally:
        if started_here:
            ray.shutdown()


# ---------------------------------------------------------------- the command

def summary(folder: Path, made: int, skipped: int, failed: list[dict]) -> str:
    lines = [f"{made} images made, {skipped} already in place, {len(failed)} failed; in {folder}"]
    for entry in failed[:FAILURES_LISTED]:
        where = "" if entry["id"] is None else f" (id {entry['id']!r}, seed {entry['seed']})"
        lines.append(f"  failed: line {entry['line']}{where}: {entry['error']}")
    if len(failed) > FAILURES_LISTED:
        lines.append(f"  ... and {len(failed) - FAILURES_LISTED} more: see {folder / MANIFEST}")
    return "\n".join(lines)


def run_batch(args: argparse.Namespace) -> int:
    config = sampler_config(args, seed=DEFAULTS.seed)  # checked before anything is read; each image has its seed
    check_image_size(args.width, args.height)
    if args.ray is None:
        if args.workers is not None or args.gpus_per_worker is not None:
            raise ValueError("--workers and --gpus-per-worker are for --ray")
        check_device(args.device)  # on Ray the device is the workers' to find
    jobs, bad = read_jobs(args.jobs, args.seeds)
    folder = OutFolder(args.out, run_settings(args, config))
    todo = [job for job in jobs if job.file not in folder.done]
    skipped = len(jobs) - len(todo)
    failed: list[dict] = []
    arrived: set[str] = set()
    made = 0
    progress = tqdm(total=len(jobs) + len(bad), initial=skipped, unit="img", desc="batch", file=sys.stderr,
                    disable=None, dynamic_ncols=True)  # on a terminal only, as generate's bar

    counted = skipped  # (a disabled bar counts nothing)

    def tally(entry: dict) -> None:
        nonlocal counted
        counted += 1
        progress.update()
        if progress.disable:  # no bar draws (a log): a line per image, as generate prints
            print(logged_line(entry, counted, len(jobs) + len(bad)), file=sys.stderr, flush=True)

    try:
        if todo:
            results = render_on_ray(args, folder.settings, todo) if args.ray is not None else \
                Renderer.load(folder.settings, args.device, args.slots, args.offload_stages).render(todo)
            with closing(results):  # on Ctrl-C too: a cluster this command started is shut down
                for file, entry, png in results:
                    if file in arrived:  # Ray delivers at least once: a retried batch sends its images again
                        continue
                    arrived.add(file)
                    folder.add(entry, png)
                    if entry["status"] == "ok":
                        made += 1
                    else:
                        failed.append(entry)
                    tally(entry)
        for job in todo:
            if job.file not in arrived:  # a worker dropped it: say so rather than finish short
                entry = record(job.line, job.id, job.seed, "no result came back from the workers")
                folder.add(entry)
                failed.append(entry)
        for entry in bad:  # after the workers have started: a model that does not load leaves DIR as it was
            folder.add(entry)
            failed.append(entry)
            tally(entry)
    finally:
        progress.close()
        folder.close()
    print(summary(args.out, made, skipped, failed))
    return EXIT_FAILED if failed else 0
