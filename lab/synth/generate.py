"""Generate a set of jobs: cases/<job>/..., labels.tsv, truth/<job>.json."""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from lab.synth import formats as F
from lab.synth import layouts
from lab.synth.cluster import TORCH_VERSIONS, Host, Job, make_job
from lab.synth.sim import Profile, Sim
from lab.synth.stories import HERRINGS, RESTARTABLE, STORIES, Label, make_ctx, pick_culprit, rh_overflow

DEFAULT_MIX = {512: 16, 1024: 12, 2048: 8, 4096: 4}


def _weighted(rng: random.Random, items: dict[str, float]) -> str:
    return rng.choices(list(items), weights=list(items.values()))[0]


def make_profile(rng: random.Random, job: Job, layout: str | None = None) -> Profile:
    weights = {"torchrun": 0.34, "srun": 0.28, "deepspeed": 0.12, "k8s": 0.16, "mpirun": 0.10}
    if layout:
        weights = {k: v for k, v in weights.items() if k in layouts.LAYOUTS[layout] or
                   (layout == "host_console" and k == "srun")}
    launcher = _weighted(rng, weights)
    per_node = launcher == "srun" and (rng.random() < 0.55 or layout == "host_console")
    options = [lay for lay, ls in layouts.LAYOUTS.items() if launcher in ls]
    if launcher == "srun" and per_node:
        options = ["slurm_single", "slurm_single", "host_console"]
    layout = layout or rng.choice(options)
    if launcher == "deepspeed":
        framework = rng.choice(["deepspeed", "deepspeed", "hf"])
    else:
        framework = _weighted(rng, {"megatron": 0.32, "hf": 0.2, "deepspeed": 0.08, "lightning": 0.12, "plain": 0.28})
    appfmt = {"megatron": rng.choice(["bare", "py"]), "hf": rng.choice(["hf", "us", "py"]), "deepspeed": "ds",
              "lightning": rng.choice(["clock", "bare"]),
              "plain": rng.choice(["py", "iso", "clock", "bare", "us"])}[framework]
    kernel = None if rng.random() < 0.3 else rng.choice(["dmesg", "dmesg-T", "kern.log", "journal"])
    if launcher == "k8s":
        kernel = None if rng.random() < 0.3 else "journal"
    script = {"megatron": "pretrain_gpt.py", "hf": "run_clm.py", "deepspeed": "train_ds.py",
              "lightning": "train.py"}.get(framework, rng.choice(["train.py", "main.py", "fsdp_train.py"]))
    return Profile(
        launcher=launcher, framework=framework, layout=layout, appfmt=appfmt,
        kill_on_bad_exit=(launcher in ("srun", "mpirun") and rng.random() < 0.6) or launcher == "mpirun",
        propagation=_weighted(rng, {"timeout": 0.5, "remote": 0.25, "mixed": 0.25}),
        kernel=kernel, agent_info=rng.random() < 0.4,
        tee=rng.random() < 0.7 and launcher in ("torchrun", "k8s", "srun"),
        role=rng.choice(["default", "default", "default", "trainer"]),
        all_rank_steps=rng.random() < 0.25, script=script,
        monitor=5.0 if job.tv < (2, 2) else 0.1, per_node_srun=per_node, max_restarts=0,
        stack_frames=job.tv >= (2, 2) and rng.random() < 0.6, buffered_stdout=rng.random() < 0.25,
    )


def _replace_host(job: Job, rng: random.Random, nr: int) -> None:
    old = job.hosts[nr]
    name = old.name + "b" if not old.name[-1].isdigit() else old.name[:-1] + str((int(old.name[-1]) + 5) % 10)
    job.hosts[nr] = Host(name, old.ip[:-1] + str((int(old.ip[-1]) + 3) % 10), nr, rng.gauss(0, 0.08),
                         rng.uniform(2e4, 4e6), rng.randint(2000, 400000), old.pod)


def generate_job(out: Path, index: int, world: int, seed: int, plan: tuple[str, str, str] | None = None,
                 start: float | None = None) -> dict[str, object]:
    """plan: (story, layout, torch version) to cover; drawn at random when None."""
    rng = random.Random(f"rootrank-synth:{seed}:{index}")
    job = make_job(rng, world, index, plan[2] if plan else None, start)
    prof = make_profile(rng, job, plan[1] if plan else None)
    if prof.launcher == "k8s":
        for h in job.hosts:
            h.pod = f"{job.name}-{'master' if h.node_rank == 0 else 'worker'}-{max(0, h.node_rank - 1)}"
    story = plan[0] if plan else rng.choices(list(STORIES), weights=[v[1] for v in STORIES.values()])[0]
    _fn, _, phase = STORIES[story]
    elastic = prof.launcher in ("torchrun", "k8s")
    mode = "none"
    x = rng.random()
    if elastic and story in RESTARTABLE and x < 0.12:
        mode = "repeat"
    elif elastic and x < 0.26:
        mode = "recovered_first"
    elif prof.layout == "slurm_single" and x < 0.36:
        mode = "requeue"
    elif elastic and x > 0.95:
        mode = "recovered_job"
    layout_variant = rng.choice(layouts.variants(prof.layout))
    if prof.layout == "interleaved":
        layout_variant = {"mpirun": "mpi", "deepspeed": "pdsh"}.get(prof.launcher) or rng.choice(["agg", "agg", "none"])
    if prof.kernel:
        layout_variant += "+" + ({"journal": "journal", "kern.log": "syslog"}.get(prof.kernel)
                                 or rng.choice(["kernel", "dmesg"]))
    sim = Sim(job, prof, rng)
    # the culprit is chosen up front so its host's clock can be set: often it runs ahead, so the culprit's own
    # lines carry stamps later than its victims' first reactions
    pre = pick_culprit(sim)
    skew_case = "random"
    if rng.random() < 0.4:
        job.host_of(pre).skew = rng.uniform(3.0, 15.0)
        skew_case = "culprit_ahead"
    elif rng.random() < 0.15:
        job.host_of(pre).skew = -rng.uniform(3.0, 15.0)
        skew_case = "culprit_behind"
    sim.forced_culprit = pre
    step_time = rng.uniform(0.8, 9.0)
    log_every = rng.choice([1, 5, 10, 10, 20, 50])
    n_lines = rng.randint(25, 120)
    dur = n_lines * log_every * step_time
    ckpt_every = log_every * rng.choice([10, 20, 25])
    step0 = rng.choice([0, 0, 1000, 25000, 120000])
    t = job.t0
    sim.host_names = [[h.name for h in job.hosts]]
    herring: list[str] = []
    label: Label

    def attempt(story_name: str, t_start: float, restart: bool, force: int | None = None,
                phase_: str = "step") -> tuple[Label, float]:
        fn_ = STORIES[story_name][0]
        sim.forced_culprit = pre if force is None else force
        if phase_ == "load":
            t_fail = t_start + rng.uniform(60, 300)
            last = sim.run_normal(t_start, t_fail, step0, step_time, log_every, 0, resume=True)
            ctx = make_ctx(sim, t_fail, last, step_time, "load")
        else:
            t_fail = t_start + dur * rng.uniform(0.6, 1.3)
            last = sim.run_normal(t_start, t_fail, step0, step_time, log_every, ckpt_every, resume=step0 > 0)
            ctx = make_ctx(sim, t_fail, last, step_time, phase_)
        lab = fn_(sim, ctx, restart=restart) if story_name in RESTARTABLE else fn_(sim, ctx)
        sim.forced_culprit = ctx.culprit
        return lab, ctx.end or t_fail + 60

    t_fail_main = t
    if mode == "repeat":
        prof.max_restarts = rng.choice([1, 2, 3])
        force = pre
        for a in range(prof.max_restarts + 1):
            sim.attempt = a
            last_attempt = a == prof.max_restarts
            t_fail_main = t
            label, end = attempt(story, t, restart=not last_attempt, force=force, phase_=phase)
            force = sim.forced_culprit
            t = end + rng.uniform(20, 90)
    elif mode in ("recovered_first", "recovered_job"):
        prof.max_restarts = 1 if mode == "recovered_first" else 3
        first_story = rng.choice(sorted(RESTARTABLE))
        _, end = attempt(first_story, t, restart=True, force=rng.randrange(job.world))
        herring.append(f"recovered:{first_story}:rank{sim.forced_culprit}")
        sim.attempt = 1
        t = end + rng.uniform(20, 90)
        if mode == "recovered_first":
            t_fail_main = t
            label, end = attempt(story, t, restart=False, phase_=phase)
        else:
            t_end = t + dur
            last = sim.run_normal(t, t_end, step0, step_time, log_every, ckpt_every, resume=True)
            _finish(sim, t_end, last)
            label = Label("none", "unknown", "recovered_job")
            end = t_end + 5
            t_fail_main = t
    elif mode == "requeue":
        # attempt 0: a node dies (no line of its own), Slurm cancels the job and requeues it on a new node
        nr = rng.randrange(len(job.hosts))
        t_fail0 = t + dur * rng.uniform(0.3, 0.8)
        sim.run_normal(t, t_fail0, step0, step_time, log_every, ckpt_every, resume=step0 > 0)
        sim.recs = [r_ for r_ in sim.recs if not (r_[2] == nr and r_[0] > t_fail0)]
        for h in job.hosts:
            if h.node_rank != nr:
                sim.emit(t_fail0 + 60 + rng.uniform(0, 2), h.node_rank, -1, "stepd", [F.stepd_cancelled(
                    job, h, t_fail0 + 60, f"JOB {job.slurm_id}", "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR "
                    "DETAILS")], True)
        herring.append(f"node_failure_requeue:{job.hosts[nr].name}")
        _replace_host(job, rng, nr)
        sim.host_names.append([h.name for h in job.hosts])
        sim.attempt = 1
        t = t_fail0 + rng.uniform(300, 1800)
        t_fail_main = t
        label, end = attempt(story, t, restart=False, phase_=phase)
    else:
        label, end = attempt(story, t, restart=False, phase_=phase)
    # red herrings
    for h_fn in rng.sample(HERRINGS, k=rng.randint(1, 3)):
        if h_fn is rh_overflow and prof.framework != "deepspeed":
            continue
        herring.append(h_fn(sim, end if h_fn.__name__ == "rh_late_xid" else max(t_fail_main + 400, end - 300)))
    jdir = out / "cases" / job.name
    if jdir.exists():
        shutil.rmtree(jdir)
    jdir.mkdir(parents=True)
    n_lines_written = layouts.write(jdir, job, prof, sim.recs, layout_variant, sim.host_names)
    truth = {
        "job": job.name, "world": job.world, "gpn": job.gpn, "torch": job.torch, "nccl": job.nccl, "tp": job.tp,
        "pp": job.pp, "dp": job.dp, "timeout_ms": job.timeout_ms, "story": label.story, "class": label.cls,
        "initiator": label.initiator, "also_ok": label.also_ok, "mode": mode, "layout": prof.layout,
        "variant": layout_variant, "profile": asdict(prof), "herrings": herring, "lines": n_lines_written,
        "skews": {h.name: round(h.skew, 3) for h in job.hosts if abs(h.skew) > 1},
        "culprit_host_skew": _culprit_skew(job, label), "skew_case": skew_case,
        "hosts": [h.name for h in job.hosts], "summaries": sim.summaries[:20],
    }
    return {"label": label, "truth": truth, "mode": mode}


def _culprit_skew(job: Job, label: Label) -> float | None:
    for term in label.initiator.split("&"):
        if term.startswith("rank="):
            return round(job.host_of(int(term[5:])).skew, 3)
    return None


def _finish(sim: Sim, t: float, step: int) -> None:
    job, prof = sim.job, sim.prof
    sim.app(0, t, "INFO", f"Training completed at step {step}. Saving final model.")
    if prof.launcher in ("torchrun", "k8s") and prof.agent_info:
        for h in job.hosts:
            sim.agent(h, t + 30, [F.elastic(job, h, t + 30, "I", F.AGENT_API, 725, f"[{prof.role}] worker group "
                                            "successfully finished. Waiting 300 seconds for other agents to finish."),
                                  F.elastic(job, h, t + 31, "I", F.AGENT_API, 1012, "Done waiting for other agents. "
                                            "Elapsed: 0.0123 seconds")])


def sizes_for(n: int, ranks: list[int]) -> list[int]:
    if sorted(ranks) == sorted(DEFAULT_MIX):
        total = sum(DEFAULT_MIX.values())
        out: list[int] = []
        for size, k in DEFAULT_MIX.items():
            out += [size] * max(1 if n >= len(DEFAULT_MIX) else 0, round(k * n / total))
        while len(out) > n:
            out.remove(max(set(out), key=out.count))
        while len(out) < n:
            out.append(512)
        return sorted(out)
    return [ranks[i % len(ranks)] for i in range(n)]


def coverage_plan(n: int, seed: int) -> list[tuple[str, str, str]]:
    """Stories, layouts and torch versions dealt out in shuffled rounds, so a small set still covers them all."""
    rng = random.Random(f"rootrank-synth-plan:{seed}")

    def deal(items: list[str]) -> list[str]:
        out: list[str] = []
        while len(out) < n:
            batch = items[:]
            rng.shuffle(batch)
            out += batch
        return out[:n]

    stories = deal(list(STORIES))
    lays = deal(list(layouts.LAYOUTS))
    torches = deal(list(TORCH_VERSIONS))
    return list(zip(stories, lays, torches, strict=True))


def generate(out: Path, jobs: int, seed: int, ranks: list[int], quiet: bool = False,
             start: float | None = None) -> list[dict[str, object]]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "truth").mkdir(exist_ok=True)
    results = []
    rows = ["file\tclass\talso_ok\tinitiator\tstrength\tmulti_rank\tsource_url"]
    plans = coverage_plan(jobs, seed)
    for i, world in enumerate(sizes_for(jobs, ranks)):
        t0 = time.monotonic()
        res = generate_job(out, i, world, seed, plans[i], start)
        label: Label = res["label"]  # type: ignore[assignment]
        truth: dict[str, object] = res["truth"]  # type: ignore[assignment]
        truth["gen_seconds"] = round(time.monotonic() - t0, 2)
        (out / "truth" / f"{truth['job']}.json").write_text(json.dumps(truth, indent=1))
        prof = truth["profile"]
        src = (f"synthetic:lab.synth/seed={seed}/story={label.story}/mode={res['mode']}/layout={truth['layout']}:"
               f"{truth['variant']}/torch={truth['torch']}/launcher={prof['launcher']}")  # type: ignore[index]
        rows.append("\t".join([str(truth["job"]), label.cls, ",".join(label.also_ok), label.initiator, "strong",
                               "yes", src]))
        if not quiet:
            print(f"{truth['job']}  {world:5d} ranks  {label.story:15s} {res['mode']:15s} {truth['layout']:12s} "
                  f"torch {truth['torch']:4s} {truth['lines']:8d} lines  {truth['gen_seconds']:5.1f}s", flush=True)
        results.append(res)
    (out / "labels.tsv").write_text("\n".join(rows) + "\n")
    return results
