# One job per run (rule run), and the runs' wandb records once they have ended (rule wandb).


def simulated(wildcards) -> bool:
    """A run of a matrix with ``set: {clock: simulated}``: P logical workers in one process."""
    return BY_SUITE[wildcards.suite]["set"].get("clock") == "simulated"


def ranks(wildcards) -> int:
    """Processes a run starts: N x G, or one for a simulated run."""
    return 1 if simulated(wildcards) else int(wildcards.nodes) * int(wildcards.ppn)


def launcher(wildcards, resources) -> str:
    """The command that starts a run, up to its arguments: on this machine (``launcher=local``) the
    forkserver's client, and the runner spawns its N x G processes itself; with ``launcher=srun``
    (the Slurm profiles) srun with the job's geometry. The geometry is spelled out because the Slurm
    plugin clears the job's SLURM_* task variables before the command runs, and srun no longer
    inherits --cpus-per-task from sbatch."""
    if resources.launcher == "local":
        return f"{PY} -m benchmarks.forkserver run {FORKSERVER}"
    if resources.launcher != "srun":
        raise ValueError(f"resource ``launcher`` must be local or srun, got {resources.launcher!r}; "
                         "set it in the profile (set-resources: run: launcher: srun)")
    if ranks(wildcards) == 1:
        return f"{PY} -m benchmarks.run"
    cpus = resources.get("cpus_per_task")
    return (f"srun --nodes={wildcards.nodes} --ntasks={ranks(wildcards)} --ntasks-per-node={wildcards.ppn}"
            + (f" --cpus-per-task={cpus}" if cpus else "") + f" {PY} -m benchmarks.run")


rule run:
    output:
        f"{RUN}/{naming.SUMMARY}",  # only the summary: Snakemake deletes a failed job's outputs, and the
        # checkpoint beside it in the run directory must survive a time limit
    log:
        "results/logs/{suite}/" + RUN_ID + ".log",
    threads: ranks
    resources:
        # The Slurm allocation follows the run: N nodes x G tasks, or one task for a simulated run.
        # The plugin wants exactly one of tasks_per_node (> 1) and tasks, and `mpi` on multi-rank
        # jobs only, so that it neither wraps the command in `srun -n1` nor asks for one task.
        nodes=lambda wc: 1 if ranks(wc) == 1 else int(wc.nodes),
        tasks_per_node=lambda wc: int(wc.ppn) if ranks(wc) > 1 and int(wc.ppn) > 1 else 0,
        tasks=lambda wc: ranks(wc) if ranks(wc) > 1 and int(wc.ppn) == 1 else 0,
        mpi=lambda wc: "srun" if ranks(wc) > 1 else "",
        launcher="local",  # the Slurm profiles set srun
    params:
        sets=sets,
        launcher=launcher,
    # Exit codes of the runner: 0 done (completed or diverged), 1 failed with a failed summary (the
    # workflow goes on and the report shows it), 75 stopped at a time limit with a checkpoint: the
    # job fails, so that the next invocation re-runs it and the runner resumes.
    shell:
        "code=0; {params.launcher} --algorithm {wildcards.algorithm}"
        " --task {wildcards.task} --nodes {wildcards.nodes} --procs-per-node {wildcards.ppn}"
        " --seed {wildcards.seed} --out $(dirname {output}) {params.sets} --defer-wandb --keep-finished"
        " >> {log} 2>&1 || code=$?;"
        " if [ $code -eq {EXIT_TIMEOUT} ]; then echo 'stopped at the time limit with a checkpoint;"
        " run snakemake again to resume' >> {log}; exit $code; fi;"
        " [ $code -eq 0 ] || test -f {output}"


# The runs' wandb records (offline unless a run's wandb_mode says online), written from their files
# in one process once they have ended: 0.1 s a run instead of wandb's 1.2 s start in every run, and
# from the submitting host, which can reach wandb's server where compute nodes often cannot.
rule wandb:
    input:
        RUNS,
    output:
        "results/logs/wandb.txt",
    log:
        "results/logs/wandb.log",
    run:
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as summaries:
            summaries.write("".join(f"{path}\n" for path in input))
            summaries.flush()
            shell("{PY} -m benchmarks.wandb_records --runs-file {summaries.name} --done {output} > {log} 2>&1")
