"""Fixtures shared by the training tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def toy_base(tmp_path_factory):
    """A reader base at toy scale (``ragrl.train.reader``): two worlds, three SFT steps, built once."""
    from ragrl.train.reader import ReaderRecipe, pretrain_reader

    out = tmp_path_factory.mktemp("reader") / "base"
    recipe = ReaderRecipe(
        worlds=2, protected=(0,), steps=3, batch_size=4, hidden=32, layers=1, heads=2, intermediate=64,
        vocab_size=1024, copy_steps=0, validation_questions=4,
    )  # fmt: skip
    manifest = pretrain_reader(out, recipe, command="ragrl model reader --worlds 2 --steps 3")
    return out, manifest


@pytest.fixture(scope="session")
def launched(world_dir, tmp_path_factory):
    """``launched(MODE, *OVERRIDES, processes=2)``: the run folder of that ``parallel_run.py`` job on 1
    or 2 processes. The first job of a group (``launch.GROUPS``: the default run's, the slow tests')
    asked for launches the group's jobs at once, once a session; a job of no group launches alone
    (tests/train/launch.py). Each launch writes ``launch-N.log``; when one fails, the jobs that ended
    keep their folders and every test of a job that did not fails with the failing job's name and the
    log's end."""
    import importlib.util
    import itertools
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("launch", Path(__file__).parent / "launch.py")
    launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch)
    root = tmp_path_factory.mktemp("launched")
    folders: dict[tuple[int, tuple[str, ...]], Path] = {}
    numbers = itertools.count()
    failed: dict[tuple[int, tuple[str, ...]], str] = {}

    def get(*job: str, processes: int = 2) -> Path:
        key = (processes, job)
        if key in failed:
            pytest.fail(failed[key])
        if key not in folders:
            group = next((g[processes] for g in launch.GROUPS if job in g[processes]), (job,))
            jobs = [j for j in group if (processes, j) not in folders]
            number = next(numbers)
            planned = {j: root / f"launch-{number}" / f"job-{i}-{j[0]}" for i, j in enumerate(jobs)}
            log = root / f"launch-{number}.log"
            try:
                launch.launch(world_dir, [(folder, j) for j, folder in planned.items()], processes, log)
            except Exception as e:  # the jobs that ended keep their folders; the first that did not is named
                ended = {j: folder for j, folder in planned.items() if (folder / "job-done").is_file()}
                folders.update(((processes, j), folder) for j, folder in ended.items())
                broken = next((" ".join(j) for j in jobs if j not in ended), None)
                if broken is None:  # every job ended: the launch failed after them
                    raise
                tail = log.read_text(errors="replace")[-6000:]
                for j in jobs:
                    if j not in ended:
                        failed[(processes, j)] = (
                            f"job {broken!r} of a launch failed ({type(e).__name__}); the launch's output "
                            f"ends:\n{tail}"
                        )
                if key in failed:
                    pytest.fail(failed[key])
            else:
                folders.update(((processes, j), folder) for j, folder in planned.items())
        return folders[key]

    return get
