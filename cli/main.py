"""The `devbridge` command line (also `python -m devbridge`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from importlib import metadata
from typing import Any, TextIO

from devbridge.backends.base import Backend
from devbridge.cli.args import (
    at_least,
    depth_or_all,
    probability,
    progress_bar,
    spans,
    trace_target_error,
    usage_error,
)


def version() -> str:
    try:
        return metadata.version("devbridge")
    except metadata.PackageNotFoundError:  # a source checkout that was never installed
        return "unknown (not installed)"


NO_CHECKOUT = (
    "CONTRACT.md is generated in devbridge's source checkout (from the spec and the tests' markers); "
    "this devbridge is installed without one"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="devbridge", description=__doc__)
    parser.add_argument("--version", action="version", version=f"devbridge {version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    example = commands.add_parser("example", help="run the bridge round trip (fake backend by default)")
    example.add_argument("--backend", choices=("fake", "tinygrad"), default="fake")
    example.add_argument("--device", default=None, help="tinygrad device (default: tinygrad's default)")
    example.add_argument("--objects", type=at_least(1), default=16)
    example.add_argument("--floats", type=at_least(1), default=1024, help="float32 values per object")
    example.add_argument("--seed", type=int, default=0)
    example.add_argument("--json", action="store_true", help="print the report as JSON")
    example.add_argument("--trace", default=None, metavar="FILE", help="as demo's")
    example.add_argument(
        "--jit", action="store_true", help="the TinyJit pattern: views as arguments, and a captured view reported"
    )
    commands.add_parser(
        "docs",
        help="write spec/CONTRACT.md and the docs' diagrams from the spec (--check; see docs -h)",
        add_help=False,
    )
    check = commands.add_parser(
        "check",
        help="exhaustive bounded model check: the core and the ring as values, then the whole Bridge in lockstep",
    )
    check.add_argument(
        "--profile", choices=("default", "narrow", "deep"), default="default", help="a bound (models.checker.PROFILES)"
    )
    for name, least, meaning in (
        ("allocations", 1, "successful allocations"),
        ("restarts", 0, "restarts"),
        ("faults", 0, "injected failures per path"),
        ("in-flight", 1, "uses in flight per allocation"),
        ("depth", 1, "actions per path in the lockstep checker"),
        ("tensors", 1, "live tensors per view (the view and those derived from it)"),
        ("ring", 1, "host ring bytes"),
    ):
        check.add_argument(f"--{name}", type=at_least(least), default=None, help=f"{meaning} (default: the profile's)")
    check.add_argument(
        "--spans", type=spans, default=None, help="device bytes a copy may touch, as OFFSET:SIZE,... (e.g. 0:4,2:4)"
    )
    check.add_argument(
        "--values-depth",
        type=depth_or_all,
        default=None,
        help="actions per path in the sans-I/O checker, or `all`: every reachable state (default: the profile's)",
    )
    check.add_argument(
        "--tier",
        choices=("both", "values", "lockstep", "ring"),
        default="both",
        help="values: the core and the ring as values (fast, wide); lockstep: the whole Bridge beside the "
        "reference model (renders a runnable counterexample test); both (default); ring: the shared ring's "
        "protocol across processes, a crash possible before every word write (--ring-bound)",
    )
    check.add_argument(
        "--ring-bound",
        choices=("ci", "finish", "tight", "deep", "small"),
        default="ci",
        help="the ring tier's bound (default: ci)",
    )
    check.add_argument(
        "--in-order",
        action="store_true",
        help="the lockstep checker's device is one in-order queue (completing an event ends what is ahead of it)",
    )
    check.add_argument("--jobs", type=at_least(1), default=os.cpu_count() or 1, help="processes (default: one per CPU)")
    check.add_argument("--no-progress", action="store_true", help=NO_PROGRESS)
    check.add_argument("--test-out", default=None, help="write the counterexample test to this file")
    demo = commands.add_parser("demo", help="run the reference worker over synthetic objects")
    demo.add_argument("--objects", type=at_least(1), default=1500, help="synthetic objects (default 1500)")
    demo.add_argument("--backend", choices=("fake", "tinygrad"), default="tinygrad")
    demo.add_argument(
        "--device",
        default=None,
        help="tinygrad device (default: tinygrad's default), or several, one bridge each: CPU:0,CPU:1",
    )
    demo.add_argument(
        "--faults",
        type=probability,
        default=0.0,
        help="probability in [0, 1) of an injected alloc, copy, free or query failure",
    )
    demo.add_argument(
        "--restart-every", type=at_least(1), default=0, help="restart the worker every K delivered objects"
    )
    demo.add_argument(
        "--batch", type=at_least(1), default=1, help="objects per upload, compute and download (default 1)"
    )
    demo.add_argument(
        "--check-host-bytes",
        action="store_true",
        help="the bridge's host-bytes checking mode: a write into bytes a copy may still read fails the copy",
    )
    demo.add_argument(
        "--inject-late-writes",
        type=probability,
        default=0.0,
        metavar="P",
        help="a deliberate bug: the producer writes into a share P of the inputs it handed over, under their upload",
    )
    demo.add_argument(
        "--processes",
        type=at_least(1),
        default=0,
        help="run as processes: P producer processes, a worker process per device, a collector process",
    )
    for what, meaning in (
        ("kill", "SIGKILL a worker each time K more objects are delivered (it is started again)"),
        ("hang", "SIGSTOP a worker each time K more objects are delivered, replace it, continue it"),
    ):
        demo.add_argument(
            f"--{what}-worker-every", type=at_least(1), default=0, metavar="K", help=f"with --processes: {meaning}"
        )
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument(
        "--trace", default=None, metavar="FILE", help="write a timeline (Chrome Trace JSON: Perfetto, chrome://tracing)"
    )
    demo.add_argument(
        "--pins-report", action="store_true", help="name each allocation still pinned at the end, and what pins it"
    )
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    demo.add_argument("--no-progress", action="store_true", help=NO_PROGRESS)
    trace = commands.add_parser("trace", help="read a trace that --trace wrote: summary, check, picture")
    trace.add_argument("file", help="the trace (Chrome Trace Event JSON)")
    trace.add_argument("--check", action="store_true", help="exit 1 naming each way it breaks the spec")
    trace.add_argument("--png", default=None, metavar="OUT", help="draw the timeline into this PNG (matplotlib)")
    fleet = commands.add_parser(
        "fleet", help="N Ray actors, each a worker with its own bridge and device (pip install 'devbridge[ray]')"
    )
    fleet.add_argument("--workers", type=at_least(1), default=2, help="Ray actors (default 2)")
    fleet.add_argument("--objects", type=at_least(1), default=600, help="synthetic objects (default 600)")
    fleet.add_argument("--batch", type=at_least(1), default=50, help="objects per actor call (default 50)")
    fleet.add_argument(
        "--kill-every",
        type=at_least(0),
        default=0,
        help="kill an actor with a batch in flight (ray.kill) each time K more objects are delivered",
    )
    fleet.add_argument("--backend", choices=("fake", "tinygrad"), default="tinygrad")
    fleet.add_argument("--device", default=None, help="devices, one per actor in turn (default: CPU:0,CPU:1,...)")
    fleet.add_argument("--faults", type=probability, default=0.0, help="as demo's, in each actor")
    fleet.add_argument("--restart-every", type=at_least(1), default=0, help="as demo's, in each actor")
    fleet.add_argument("--seed", type=int, default=0)
    fleet.add_argument("--address", default=None, help="a Ray cluster to join (default: a local Ray)")
    fleet.add_argument(
        "--trace", default=None, metavar="FILE", help="as demo's: the driver's batches and each batch's bridge"
    )
    fleet.add_argument("--json", action="store_true", help="print the summary as JSON")
    fleet.add_argument("--no-progress", action="store_true", help=NO_PROGRESS)
    commands.add_parser(
        "bench", help="every speed and memory goal, bridge beside raw tinygrad (see bench -h)", add_help=False
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["docs"]:
        from devbridge.checkout import script

        try:
            docs = script("docs")  # it reads the tests' markers: a tool of the checkout, not in the wheel
        except ModuleNotFoundError:
            print(f"devbridge docs: {NO_CHECKOUT}", file=sys.stderr)
            return 2
        code: int = docs.main(argv[1:])
        return code
    if argv[:1] == ["bench"]:
        from devbridge.bench.suite import main as bench_main

        return bench_main(argv[1:])
    args = parser.parse_args(argv)
    from devbridge.errors import InvalidArgumentError

    try:
        return run_command(args)
    except InvalidArgumentError as e:  # an option the run found wrong only once it began (a trace file
        return usage_error(args.command, e.detail)  # that cannot be made there, say): one line, as argparse's


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command (every command but docs and bench, which parse their own options)."""
    if args.command == "check":
        from devbridge.cli.check import run_check

        return run_check(args)
    if args.command == "trace":
        from devbridge.apps.timeline import command

        return command(args.file, check=args.check, png=args.png)
    if (problem := trace_target_error(getattr(args, "trace", None))) is not None and args.command != "trace":
        return usage_error(args.command, problem)
    if args.command == "fleet":
        return run_fleet_command(args)
    if args.command == "demo" and (args.processes or args.kill_worker_every or args.hang_worker_every):
        return run_processes_command(args)
    if args.command == "demo" and args.device is not None and "," in args.device:
        return run_devices_command(args)
    backend = open_backend(args)
    if backend is None:
        return 2
    if args.command == "demo":
        return run_demo_command(args, backend)
    if args.jit:
        return run_jit_command(args, backend)
    from devbridge.apps.example import run_example

    report = run_example(args.objects, args.floats, args.seed, backend, trace=args.trace)
    text = (
        f"objects {report.objects}  verified {report.verified}  lost {report.lost}\n"
        f"bytes in {report.bytes_in}  bytes out {report.bytes_out}  deferred frees {report.deferred_frees}\n"
        f"calls {report.calls}\n"
        f"at the end: live allocations {report.live_allocations}, "
        f"unreleased host bytes {report.unreleased_host_bytes}\n"
        f"{report.seconds:.2f} s"
    )
    return show(args, report, text, report.lost == report.live_allocations == report.unreleased_host_bytes == 0)


NO_PROGRESS = "no progress bar (there is one only when stderr is a terminal)"


def open_backend(args: argparse.Namespace, device: str | None = None) -> Backend | None:
    """The backend the options name (on `device`, else --device), opened before any work; None
    (and one line) if it cannot be."""
    from devbridge.apps.backends import make_backend
    from devbridge.errors import InvalidArgumentError

    device = device or args.device
    if args.backend == "fake" and device is not None:
        usage_error(args.command, "--device names a tinygrad device; the fake backend has none")
        return None
    try:
        backend = make_backend(args.backend, device)
    except InvalidArgumentError as e:
        usage_error(args.command, e.detail)
        return None
    unusable = getattr(backend, "unusable", None)  # a tinygrad device: can it run the worker?
    if unusable is not None and (reason := unusable()) is not None:
        usage_error(args.command, reason)
        return None
    return backend


def run_jit_command(args: argparse.Namespace, backend: Backend) -> int:
    from devbridge.apps.example import run_jit_example

    report = run_jit_example(backend=backend, seed=args.seed)
    text = (
        f"jitted steps {report.steps}  verified {report.verified}  restarts {report.restarts}\n"
        f"a JIT that captured the weights' view in a closure: after free_device the weights are "
        f"{report.captured_state} ({report.captured_views} live view); released once the JIT is gone: "
        f"{report.captured_released}\n"
        f"at the end: live allocations {report.live_allocations}"
    )
    clean = report.verified == report.steps and report.captured_released and report.live_allocations == 0
    return show(args, report, text, clean)


def show(args: argparse.Namespace, report: Any, text: str, clean: bool) -> int:
    """Print a report as JSON (--json) or as text; the exit status says whether it is clean."""
    print(json.dumps(asdict(report)) if args.json else text)
    return 0 if clean else 1


#: What a kernel compiler in a C library (clang, in pocl and in tinygrad's CPU device) prints.
COMPILER_CHATTER = re.compile(rb"\d+ warnings? generated\.")


@contextlib.contextmanager
def without_compiler_chatter() -> Iterator[TextIO]:
    """Kernel compilers in C libraries print their warning counts straight to file descriptor 2:
    what reaches it while the block runs is held in a file and written back after it, less
    those lines. The stream yielded writes to the real stderr at once (a progress bar)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            with os.fdopen(os.dup(saved), "w") as live:
                yield live
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in held.read().splitlines(keepends=True):
                if not COMPILER_CHATTER.fullmatch(line.rstrip(b"\r\n")):
                    os.write(2, line)


def run_demo_command(args: argparse.Namespace, backend: Backend) -> int:
    shown = progress_bar(args) and not args.json  # (asked before stderr is held: is it a terminal)
    with without_compiler_chatter() as stderr:
        return _run_demo(args, backend, stderr, shown)


def _run_demo(args: argparse.Namespace, backend: Backend, stderr: TextIO, shown: bool) -> int:
    from tqdm import tqdm

    from devbridge.apps.worker import WorkerStalled, run_demo

    with tqdm(total=args.objects, unit=" objects", disable=not shown, leave=False, file=stderr) as bar:

        def progress(done: int) -> None:
            bar.update(done - bar.n)

        try:
            summary = run_demo(
                args.objects,
                backend,
                None,
                args.faults,
                args.restart_every,
                args.seed,
                progress,
                args.trace,
                pins_report=args.pins_report,
                batch=args.batch,
                check_host_bytes=True if args.check_host_bytes else None,
                late_writes=args.inject_late_writes,
            )
        except WorkerStalled as e:
            print(f"devbridge demo: {e}", file=sys.stderr)
            return 1
    s = summary
    # with late writes: every one caught and no other report, and every object delivered or rejected
    spoiled = s.late_writes_missed == s.false_reports == 0 and s.late_writes_caught == s.late_writes
    whole = s.lost == s.duplicated == s.wrong == 0 and s.delivered + s.rejected == s.objects
    unreleased = s.unreleased_input_bytes + s.unreleased_output_bytes
    clean = (whole and spoiled if s.late_writes else s.clean) and unreleased == 0
    if args.json:
        print(json.dumps({**asdict(summary), "clean": clean}))
    else:
        print(
            f"backend {s.backend}: {s.delivered}/{s.objects} objects in {s.seconds:.1f} s "
            f"({s.objects_per_s:.0f} objects/s)\n"
            f"bytes in {s.bytes_in} ({s.gb_per_s_in:.4f} GB/s)  bytes out {s.bytes_out} ({s.gb_per_s_out:.4f} GB/s)\n"
            f"allocations {s.allocations} (peak live {s.peak_live_allocations})  deferred frees {s.deferred_frees}  "
            f"computes overlapping an upload {s.overlapped_computes}  producer blocked {s.producer_blocked_s:.1f} s\n"
            f"faults injected {s.faults_injected}, recovered {s.faults_recovered}, "
            f"failed frees reported {s.free_failures}  restarts {s.restarts}\n"
            f"unreleased bytes: input ring {s.unreleased_input_bytes}, output ring {s.unreleased_output_bytes}\n"
            + (
                f"late writes injected {s.late_writes}: caught {s.late_writes_caught}, missed "
                f"{s.late_writes_missed}, false reports {s.false_reports}  objects rejected {s.rejected}\n"
                if s.late_writes or s.false_reports
                else ""
            )
            + f"lost: {s.lost}  duplicated: {s.duplicated}  wrong: {s.wrong}"
        )
        if args.pins_report:
            print(f"pinned at the end: {len(s.pinned)} allocations", *s.pinned, sep="\n  ")
    return 0 if clean else 1


def device_names(option: str) -> list[str]:
    """`--device A,B,...` as names; empty unless they are distinct and none is empty."""
    names = option.split(",")
    return names if len(set(names)) == len(names) and all(names) else []


def run_processes_command(args: argparse.Namespace) -> int:
    """`demo --processes P`: producers, workers and a collector as processes (worker.run_processes)."""
    if not args.processes:
        return usage_error("demo", "--kill-worker-every and --hang-worker-every need --processes")
    if args.pins_report:
        return usage_error("demo", "--pins-report reports a worker in this process: leave out --processes")
    if args.check_host_bytes or args.inject_late_writes:
        return usage_error("demo", "--check-host-bytes and --inject-late-writes run one worker in this process")
    devices: list[str | None] = [None] if args.device is None else list(device_names(args.device))
    if not devices:
        return usage_error("demo", f"--device needs distinct device names, got {args.device!r}")
    opened = [open_backend(args, device) for device in devices]  # each checked here, before any process
    if any(backend is None for backend in opened):
        return 2
    from devbridge.apps.worker import backend_name

    labels = [backend_name(backend) for backend in opened if backend is not None]
    shown = progress_bar(args) and not args.json
    with without_compiler_chatter() as stderr:  # (the children write to the stderr they inherit)
        return _run_processes(args, devices, ", ".join(labels), stderr, shown)


def _run_processes(args: argparse.Namespace, devices: list[str | None], label: str, stderr: TextIO, shown: bool) -> int:
    from tqdm import tqdm

    from devbridge.apps.worker.processes import run_processes

    with tqdm(total=args.objects, unit=" objects", disable=not shown, leave=False, file=stderr) as bar:

        def progress(done: int) -> None:
            bar.update(done - bar.n)

        s = run_processes(
            args.objects, args.processes, args.backend, devices, args.faults, args.restart_every,
            args.kill_worker_every, args.hang_worker_every, args.seed, args.batch, progress, trace=args.trace,
        )  # fmt: skip
    s.backend = label
    clean = s.clean and s.repeated_inputs == s.malformed == 0 and not s.leftover_segments
    if args.json:
        print(json.dumps({**asdict(s), "clean": clean}))
        return 0 if clean else 1
    workers = f"{len(devices)} worker process{'es' if len(devices) > 1 else ''}"
    print(
        f"backend {s.backend}: {s.processes} producer process{'es' if s.processes > 1 else ''}, {workers}, "
        f"a collector: {s.delivered}/{s.objects} objects in {s.seconds:.1f} s ({s.objects_per_s:.0f} objects/s)\n"
        f"workers killed {s.kills}, hung {s.hangs} (fenced on waking {s.fenced}); worker processes started "
        f"{s.worker_starts}\n"
        f"input records delivered again {s.redelivered} (finished before the crash {s.finished_before}); "
        f"malformed records {s.malformed}\n"
        f"faults injected {s.faults_injected}, recovered {s.faults_recovered}  bridge restarts {s.restarts}\n"
        f"input records the collector saw twice {s.repeated_inputs}; segments left in /dev/shm "
        f"{len(s.leftover_segments)}\n"
        f"lost: {s.lost}  duplicated: {s.duplicated}  wrong: {s.wrong}"
    )
    return 0 if clean else 1


def run_fleet_command(args: argparse.Namespace) -> int:
    """`fleet`: Ray actors, one bridge and device each (fleet.run_fleet)."""
    from tqdm import tqdm

    from devbridge.apps.fleet import FleetUnavailable, ray_module, run_fleet

    try:
        ray_module()
    except FleetUnavailable as e:
        return usage_error("fleet", str(e))
    devices: list[str | None] = [None]
    if args.device is not None:
        devices = list(args.device.split(","))
        if not all(devices):
            return usage_error("fleet", f"--device needs device names, got {args.device!r}")
    elif args.backend == "tinygrad":
        devices = [f"CPU:{i}" for i in range(args.workers)]
    if any(open_backend(args, device) is None for device in devices):  # each checked here, before Ray starts
        return 2
    with tqdm(total=args.objects, unit=" objects", disable=not progress_bar(args) or args.json, leave=False) as bar:

        def progress(done: int) -> None:
            bar.update(done - bar.n)

        s = run_fleet(
            args.objects, args.workers, args.backend, devices, args.kill_every, args.batch, args.faults,
            args.restart_every, args.seed, args.address, progress, args.trace,
        )  # fmt: skip
    actors = "\n".join(
        f"  {a.device}: {a.batches} batches, {a.objects} objects, busy {a.busy_s:.2f} s, {a.killed} killed"
        for a in s.actors
    )
    text = (
        f"objects {s.objects}  delivered {s.delivered}  lost {s.lost}  duplicated {s.duplicated}  wrong {s.wrong}\n"
        f"{s.workers} actor{'s' if s.workers != 1 else ''}:\n{actors}\n"
        f"killed {s.kills}, replaced {s.replaced}, redelivered {s.redelivered} objects; bridge restarts {s.restarts}\n"
        f"{s.seconds:.2f} s, {s.objects_per_s:.1f} objects/s"
    )
    return show(args, s, text, s.clean)


def run_devices_command(args: argparse.Namespace) -> int:
    """`demo --device A,B,...`: one bridge per device in this process (worker.run_devices)."""
    from tqdm import tqdm

    from devbridge.apps.worker import run_devices

    if args.pins_report:
        return usage_error("demo", "--pins-report reports one worker: name one device")
    if args.check_host_bytes or args.inject_late_writes:
        return usage_error("demo", "--check-host-bytes and --inject-late-writes run one worker: name one device")
    devices = device_names(args.device)
    if not devices:
        return usage_error("demo", f"--device needs distinct device names, got {args.device!r}")
    if any(open_backend(args, device) is None for device in devices):
        return 2
    with tqdm(total=args.objects, unit=" objects", disable=not progress_bar(args) or args.json, leave=False) as bar:

        def progress(done: int) -> None:
            bar.update(done - bar.n)

        s = run_devices(
            args.objects,
            devices,
            args.backend,
            args.faults,
            args.restart_every,
            args.seed,
            progress,
            trace=args.trace,
            batch=args.batch,
        )
    if args.json:
        print(json.dumps({**asdict(s), "clean": s.clean}))
    else:
        lines = [
            f"{len(devices)} devices: {s.delivered}/{s.objects} objects in {s.seconds:.1f} s "
            f"({s.objects_per_s:.0f} objects/s), {s.redone} redone on another device"
        ]
        for d in s.devices:
            lines.append(
                f"  {d.device}: {d.delivered}/{d.objects} objects in {d.seconds:.1f} s ({d.objects_per_s:.0f} "
                f"objects/s)  restarts {d.restarts}  faults injected {d.faults_injected}, recovered "
                f"{d.faults_recovered}" + (f"  gave up: {d.stalled}" if d.stalled else "")
            )
        lines.append(f"lost: {s.lost}  duplicated: {s.duplicated}  wrong: {s.wrong}")
        print("\n".join(lines))
    return 0 if s.clean else 1


if __name__ == "__main__":
    sys.exit(main())
