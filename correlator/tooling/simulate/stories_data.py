"""Stories of data-pipeline and checkpoint failures.

Formats from the libraries that print them: botocore's ClientError template and exceptions.py, google-auth,
huggingface_hub / datasets, webdataset's tariterators, torch/utils/data (the DataLoader worker re-raise
of torch/_utils.py), torch/serialization.py and caffe2/serialize/inline_container.cc, CPython's _pickle.c,
safetensors' tensor.rs, transformers' trainer.py, DeepSpeed's engine and checkpoint engines, Megatron-LM,
torch.distributed.checkpoint, TensorRT-LLM's executor worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from correlator.tooling.simulate.story import Outcome, Stage, story
from correlator.tooling.simulate.upstream import Env, Frame, load_frames, traceback

if TYPE_CHECKING:
    from correlator.tooling.simulate.job import Process

_BUCKET = ["s3://datasets-prod/tokenized/fineweb-edu", "s3://ml-team/corpora/redpajama-v2"]


def _worker_reraise(sc: Stage, t: float, p: Process, worker_frames: list[Frame], exc: list[str],
                    wrapper: str | None = None) -> float:
    """An exception inside a DataLoader worker, re-raised in the main process (ExceptionWrapper.reraise):
    'X: Caught X in DataLoader worker process N.' then the worker's 'Original Traceback'."""
    env = sc.env
    name = exc[-1].split(":", 1)[0]
    short = name.rsplit(".", 1)[-1]
    worker = sc.pick("worker_id", [0, 1, 2, 3, 5])
    dl = env.lib("torch/utils/data/dataloader.py")
    frames = [(env.script, 388, "train", "for step, batch in enumerate(train_loader):"),
              (dl, 701 if env.torch >= (2, 4) else 631, "__next__", "data = self._next_data()"),
              (dl, 1465 if env.torch >= (2, 4) else 1346, "_next_data", "return self._process_data(data)"),
              (dl, 1491 if env.torch >= (2, 4) else 1372, "_process_data", "data.reraise()"),
              (env.lib("torch/_utils.py"), 715 if env.torch >= (2, 4) else 705, "reraise", "raise exception")]
    head = f"{wrapper or name}: Caught {short} in DataLoader worker process {worker}."
    original = traceback(
        [(env.lib("torch/utils/data/_utils/worker.py"), 351 if env.torch >= (2, 4) else 308, "_worker_loop",
          "data = fetcher.fetch(index)  # type: ignore[possibly-undefined]"),
         (env.lib("torch/utils/data/_utils/fetch.py"), 33, "fetch", "data.append(next(self.dataset_iter))"),
         *worker_frames], exc)
    original[0] = "Original Traceback (most recent call last):"
    return sc.rank(t, p, traceback(frames, [head]) + original)


# --- data pipeline -----------------------------------------------------------------------------------------


@story("streaming_data_error")
def streaming_data_error(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    bucket = sc.pick("bucket", _BUCKET)
    shard = f"{bucket}/train-{sc.rng.randint(100, 999):05d}.bin"
    host = bucket.split("/")[2]
    frames: list[Frame] = [(env.script, 144, "__iter__", "buf = self._read_shard(url)"),
                           (env.script, 121, "_read_shard", "return obj['Body'].read()"),
                           (env.lib("botocore/response.py"), 99, "read", ("chunk = self." "_raw_stream.read(amt)"))]  # noqa: ISC001 - split: see upstream.py
    if sc.pick("stream", ["read_timeout", "incomplete"]) == "read_timeout":
        exc = [(f'botocore.exceptions.ReadTimeoutError: Read timeout on endpoint URL: "https://{host}.s3.us-east-1.'
               f'amazonaws.com/{shard.split("/", 3)[3]}"')]
        kind = "S3 read timeout"
    else:
        n = sc.rng.randint(1, 60) * 1048576
        exc = [("botocore.exceptions.ResponseStreamingError: An error occurred while reading from response stream: "
               f"('Connection broken: IncompleteRead({n} bytes read, {134217728 - n} more expected)', "
               f"IncompleteRead({n} bytes read, {134217728 - n} more expected))")]
        kind = "S3 stream broken mid-read"
    _worker_reraise(sc, t, p, frames, exc, wrapper="RuntimeError")
    return Outcome(exc[0], story=kind)


@story("s3_slowdown")
def s3_slowdown(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    frames: list[Frame] = [
        (env.script, 121, "_read_shard", "obj = self.s3.get_object(Bucket=bucket, Key=key)"),
        (env.lib("botocore/client.py"), 569, "_api_call", "return self._make_api_call(operation_name, kwargs)"),
        (env.lib("botocore/client.py"), 1023, "_make_api_call", "raise error_class(parsed_response, operation_name)"),
    ]
    exc = [("botocore.exceptions.ClientError: An error occurred (SlowDown) when calling the GetObject operation "
           "(reached max retries: 4): Please reduce your request rate.")]
    _worker_reraise(sc, t, p, frames, exc)
    return Outcome(exc[0], story="GetObject throttled")


@story("gcs_auth_expired")
def gcs_auth_expired(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    if sc.pick("cloud", ["gcs", "aws"]) == "gcs":
        frames: list[Frame] = [(env.lib("gcsfs/core.py"), 1090, "_cat_file",
                                "headers, out = await self._call(\"GET\", u2, headers=head)"),
                               (env.lib("gcsfs/credentials.py"), 187, "maybe_refresh", "self.credentials.refresh(req)"),
                               (env.lib("google/oauth2/_client.py"), 69, "_handle_error_response",
                                "raise exceptions.RefreshError(")]
        exc = [("google.auth.exceptions.RefreshError: ('invalid_grant: Token has been expired or revoked.', "
               "{'error': 'invalid_grant', 'error_description': 'Token has been expired or revoked.'})")]
        kind = "GCS user credentials revoked"
    else:
        frames = [(env.script, 121, "_read_shard", "obj = self.s3.get_object(Bucket=bucket, Key=key)"),
                  (env.lib("botocore/client.py"), 1023, "_make_api_call", "raise error_class(parsed_response, operation_name)")]
        exc = [("botocore.exceptions.ClientError: An error occurred (ExpiredToken) when calling the GetObject operation: "
               "The provided token has expired.")]
        kind = "AWS session token expired"
    _worker_reraise(sc, t, p, frames, exc, wrapper="RuntimeError")
    return Outcome(exc[0], story=kind)


@story("webdataset_tar_error")
def webdataset_tar_error(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    url = f"pipe:aws s3 cp {sc.pick('bucket', _BUCKET)}/wds/shard-{sc.rng.randint(0, 4095):06d}.tar -"
    frames: list[Frame] = [(env.lib("webdataset/tariterators.py"), 177, "tar_file_expander",
                            "for sample in tar_file_iterator("),
                           (env.lib("webdataset/tariterators.py"), 131, "tar_file_iterator", "for tarinfo in stream:"),
                           ("/usr/lib/python3.10/tarfile.py", 2460, "__iter__", "tarinfo = self.next()"),
                           ("/usr/lib/python3.10/tarfile.py", 2349, "next", 'raise ReadError("unexpected end of data")')]
    exc = [f"tarfile.ReadError: unexpected end of data @ {url}"]
    _worker_reraise(sc, t, p, frames, exc)
    return Outcome(exc[0], story="truncated tar shard")


@story("dataloader_worker_killed")
def dataloader_worker_killed(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    worker = p.pid + 101
    dl = env.lib("torch/utils/data/dataloader.py")
    inner = traceback(
        [(dl, 1133, "_try_get_data", "data = self._data_queue.get(timeout=timeout)"),
         (f"/usr/lib/python{env.python}/queue.py", 180, "get", "self.not_empty.wait(remaining)"),
         (env.lib("torch/utils/data/_utils/signal_handling.py"), 67, "handler", "_error_if_any_worker_fails()")],
        [f"RuntimeError: DataLoader worker (pid {worker}) is killed by signal: Killed. "])
    outer = traceback([(env.script, 388, "train", "for step, batch in enumerate(train_loader):"),
                       (dl, 1146, "_try_get_data", ("raise RuntimeError(f'DataLoader worker (pid(s) {pids_str}) exited "
                                                   "unexpectedly') from e"))],
                      [f"RuntimeError: DataLoader worker (pid(s) {worker}) exited unexpectedly"], chained_from=inner)
    sc.rank(t, p, outer)
    return Outcome(f"RuntimeError: DataLoader worker (pid {worker}) is killed by signal: Killed. ", story="worker SIGKILL")


@story("dataset_license_issue", "all")
def dataset_license_issue(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    repo = sc.pick("gated", ["meta-llama/Llama-3.1-8B-evals", "bigcode/the-stack-v2-dedup"])
    frames: list[Frame] = [(env.script, 540, "main", f"ds = load_dataset(\"{repo}\", split=\"train\", streaming=True)"),
                           (env.lib("datasets/load.py"), 2062, "load_dataset", "builder_instance = load_dataset_builder(")]
    if sc.pick("gated_variant", ["hub", "datasets"]) == "hub":
        exc = [("huggingface_hub.errors.GatedRepoError: 403 Client Error. (Request ID: Root=1-67d3f0a1-2b9c6e0f1a7d4c3b5e6f7a8b;"
               "9d1c2b3a-4e5f-6a7b-8c9d-0e1f2a3b4c5d)"), "",
               f"Cannot access gated repo for url https://huggingface.co/datasets/{repo}/resolve/main/README.md.",
               (f"Access to dataset {repo} is restricted and you are not in the authorized list. Visit "
               f"https://huggingface.co/datasets/{repo} to ask for access.")]
    else:
        exc = [(f"datasets.exceptions.DatasetNotFoundError: Dataset '{repo}' is a gated dataset on the Hub. You must be "
               "authenticated to access it.")]
    sc.rank(t, p, traceback(frames, exc))
    return Outcome(exc[0] if len(exc) == 1 else exc[2], story="gated dataset")


@story("pii_leakage", "continue")
def pii_leakage(sc: Stage, t: float, p: Process) -> Outcome:
    """The site's presidio-based filter in the data pipeline finds personal data in a shard and drops it."""
    shard = f"{sc.pick('bucket', _BUCKET)}/web/shard-{sc.rng.randint(0, 999):05d}.jsonl.zst"
    text = (f"PII entities detected: 3 (EMAIL_ADDRESS=2, PHONE_NUMBER=1) in sample {sc.rng.randint(1000, 99999)} of "
            f"{shard}; sample dropped")
    sc.pylog(t, p, text, level="W", logger="data.pii_filter")
    return Outcome(text, story="presidio filter hit")


# --- checkpoints: loading -------------------------------------------------------------------------------


def _ckpt(sc: Stage) -> str:
    return sc.pick("ckpt", ["/checkpoints/run-17/step_4000.pt", "/mnt/ckpt/llama-8b/iter_0012000/model.pt"])


def _zip_reader_frames(env: Env) -> list[Frame]:
    return [(env.lib("torch/serialization.py"), 751 if env.torch >= (2, 4) else 564, "__init__",
             "super().__init__(torch._C.PyTorchFileReader(name_or_buffer))")]


def _record_frames(env: Env) -> list[Frame]:
    s = env.lib("torch/serialization.py")
    return [(s, 1384, "load", "return _load("), (s, 1628, "_load", "result = unpickler.load()"),
            (s, 1593, "persistent_load", "typed_storage = load_tensor("),
            (s, 1555, "load_tensor", "zip_file.get_storage_from_record(name, numel, torch.UntypedStorage)")]


def _load_error(sc: Stage, t: float, p: Process, exc: list[str], kind: str, *, frames: list[Frame] | None = None,
                chained: list[str] | None = None) -> Outcome:
    frames = frames if frames is not None else load_frames(sc.env, _ckpt(sc))
    sc.rank(t, p, traceback(frames, exc, chained_from=chained))
    return Outcome(exc[0], story=kind)


@story("checkpoint_corruption", "all")
def checkpoint_corruption(sc: Stage, t: float, p: Process) -> Outcome:
    record = sc.pick("record", [1373, 57, 912])
    why = sc.pick("corrupt", ["invalid header or archive is corrupted", "CRC-32 check failed"])
    exc = [f"RuntimeError: PytorchStreamReader failed reading file data/{record}: {why}"]
    return _load_error(sc, t, p, exc, f"zip record unreadable ({why})",
                       frames=load_frames(sc.env, _ckpt(sc))[:3] + _record_frames(sc.env))


def _central_directory(sc: Stage, t: float, p: Process, kind: str) -> Outcome:
    exc = ["RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory"]
    return _load_error(sc, t, p, exc, kind, frames=load_frames(sc.env, _ckpt(sc)) + _zip_reader_frames(sc.env))


@story("checkpoint_torn_write", "all", before="preempted")
def checkpoint_torn_write(sc: Stage, t: float, p: Process) -> Outcome:
    """The requeued job resumes from the checkpoint the preemption interrupted: its zip has no central directory."""
    return _central_directory(sc, t, p, "resume after a preemption mid-save")


@story("partial_checkpoint_save", "all", accepted=("disk_full",), before="disk_full")
def partial_checkpoint_save(sc: Stage, t: float, p: Process) -> Outcome:
    """Attempt 0 died saving on a full disk; the restarted workers load the truncated file it left."""
    return _central_directory(sc, t, p, "resume from the save that hit ENOSPC")


@story("unpickling_truncated", "all")
def unpickling_truncated(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    s = env.lib("torch/serialization.py")
    frames = [*load_frames(env, _ckpt(sc))[:3], (s, 1040, "load", "return _legacy_load("),
              (s, 1258, "_legacy_load", "magic_number = pickle_module.load(f, **pickle_load_args)")]
    exc = sc.pick("pickle", [["_pickle.UnpicklingError: pickle data was truncated"], ["EOFError: Ran out of input"]])
    return _load_error(sc, t, p, exc, "legacy checkpoint cut short", frames=frames)


@story("torch_load_failed", "all")
def torch_load_failed(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    variant = sc.pick("load", ["lfs", "record", "device"])
    if variant == "lfs":
        # a git-lfs pointer file where the weights should be (transformers' load_state_dict)
        mu = env.lib("transformers/modeling_utils.py")
        load = "return torch.load(checkpoint_file, map_location=map_location, weights_only=True)"
        inner = traceback([(mu, 575, "load_state_dict", load)], ["_pickle.UnpicklingError: invalid load key, 'v'."])
        exc = [("OSError: You seem to have cloned a repository without having git-lfs installed. Please install git-lfs and "
               "run `git lfs install` followed by `git lfs pull` in the folder you cloned.")]
        return _load_error(sc, t, p, exc, "git-lfs pointer instead of weights",
                           frames=[(env.script, 540, "main", "model = AutoModelForCausalLM.from_pretrained(args.model)"),
                                   (mu, 587, "load_state_dict", 'if f.read(7) == "version":')], chained=inner)
    if variant == "record":
        exc = ["RuntimeError: PytorchStreamReader failed locating file data.pkl: file not found"]
        return _load_error(sc, t, p, exc, "zip without data.pkl",
                           frames=load_frames(env, _ckpt(sc)) + _zip_reader_frames(env))
    exc = [("RuntimeError: Attempting to deserialize object on CUDA device 3 but torch.cuda.device_count() is 1. Please "
           "use torch.load with map_location to map your storages to an existing device.")]
    return _load_error(sc, t, p, exc, "saved on a GPU this process does not see",
                       frames=load_frames(env, _ckpt(sc))[:3] + _record_frames(env)[:3])


@story("weights_only_unpickling_error", "all")
def weights_only_unpickling_error(sc: Stage, t: float, p: Process) -> Outcome:
    exc = [("_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, to do so you have two "
           "options, \x1b[1mdo those steps only if you trust the source of the checkpoint\x1b[0m. "),
           ("\t(1) In PyTorch 2.6, we changed the default value of the `weights_only` argument in `torch.load` from `False` "
           "to `True`. Re-running `torch.load` with `weights_only` set to `False` will likely succeed, but it can result "
           "in arbitrary code execution. Do it only if you got the file from a trusted source."),
           ("\t(2) Alternatively, to load with `weights_only=True` please check the recommended steps in the following "
           "error message."),
           ("\tWeightsUnpickler error: Unsupported global: GLOBAL argparse.Namespace was not an allowed global by default. "
           "Please use `torch.serialization.add_safe_globals([Namespace])` or the "
           "`torch.serialization.safe_globals([Namespace])` context manager to allowlist this global if you trust this "
           "class/function."), "",
           ("Check the documentation of torch.load to learn more about types accepted by default with weights_only "
           "https://pytorch.org/docs/stable/generated/torch.load.html.")]
    return _load_error(sc, t, p, exc, "torch 2.6 weights_only default")


@story("checkpoint_version_incompatible", "all")
def checkpoint_version_incompatible(sc: Stage, t: float, p: Process) -> Outcome:
    if sc.pick("version", ["format", "numpy"]) == "format":
        exc = [("RuntimeError: Attempted to read a PyTorch file with version 10, but the maximum supported version for "
               "reading is 9. Your PyTorch installation may be too old.")]
        return _load_error(sc, t, p, exc, "file format newer than this torch",
                           frames=load_frames(sc.env, _ckpt(sc)) + _zip_reader_frames(sc.env))
    exc = ["ModuleNotFoundError: No module named 'numpy._core'"]
    s = sc.env.lib("torch/serialization.py")
    return _load_error(sc, t, p, exc, "saved with numpy 2, loaded with numpy 1",
                       frames=[*load_frames(sc.env, _ckpt(sc))[:3], (s, 1628, "_load", "result = unpickler.load()"),
                               (s, 1620, "find_class", "return super().find_class(mod_name, name)")])


@story("safetensors_load_error", "all")
def safetensors_load_error(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    mu = env.lib("transformers/modeling_utils.py")
    frames: list[Frame] = [(env.script, 540, "main", "model = AutoModelForCausalLM.from_pretrained(args.model)"),
                           (mu, 4225, "from_pretrained", "state_dict = load_state_dict(resolved_archive_file)"),
                           (mu, 556, "load_state_dict", 'with safe_open(checkpoint_file, framework="pt") as f:')]
    why = sc.pick("st", ["MetadataIncompleteBuffer", "incomplete metadata, file not fully covered", "HeaderTooLarge"])
    exc = [f"safetensors_rust.SafetensorError: Error while deserializing header: {why}"]
    return _load_error(sc, t, p, exc, f"safetensors header: {why}", frames=frames)


@story("model_state_dict_mismatch", "all")
def model_state_dict_mismatch(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    frames = [*load_frames(env, _ckpt(sc))[:2], (env.script, 214, "load_checkpoint", 'model.load_state_dict(ckpt["model"])'),
              (env.lib("torch/nn/modules/module.py"), 2584, "load_state_dict", "raise RuntimeError(")]
    exc = ["RuntimeError: Error(s) in loading state_dict for LlamaForCausalLM:",
           ("\tsize mismatch for lm_head.weight: copying a param with shape torch.Size([32000, 4096]) from checkpoint, the "
           "shape in current model is torch.Size([32064, 4096])."),
           ("\tsize mismatch for model.embed_tokens.weight: copying a param with shape torch.Size([32000, 4096]) from "
           "checkpoint, the shape in current model is torch.Size([32064, 4096]).")]
    return _load_error(sc, t, p, exc, "vocabulary resized", frames=frames)


@story("optimizer_state_dict_mismatch", "all")
def optimizer_state_dict_mismatch(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    frames = [*load_frames(env, _ckpt(sc))[:2],
              (env.script, 216, "load_checkpoint", 'optimizer.load_state_dict(ckpt["optimizer"])'),
              (env.lib("torch/optim/optimizer.py"), 903, "load_state_dict", "raise ValueError(")]
    exc = ["ValueError: loaded state dict contains a parameter group that doesn't match the size of optimizer's group"]
    return _load_error(sc, t, p, exc, "parameter groups changed", frames=frames)


@story("optimizer_state_resize_failure", "all")
def optimizer_state_resize_failure(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    if sc.pick("resize", ["zero", "megatron"]) == "zero":
        frames: list[Frame] = [(env.script, 540, "main", "_, client_state = engine.load_checkpoint(args.ckpt_dir)"),
                               (env.lib("deepspeed/runtime/engine.py"), 2930, "load_checkpoint",
                                ("success = self._load_zero_checkpoint(load_dir, tag, "
                                 "load_optimizer_states=load_optimizer_states)")),
                               (env.lib("deepspeed/runtime/engine.py"), 3097, "_load_zero_checkpoint",
                                "raise ZeRORuntimeException(")]
        exc = [(f"deepspeed.runtime.zero.utils.ZeRORuntimeException: The checkpoint being loaded used a DP world size of "
               f"{sc.world_size // 2} but the current world size is {sc.world_size}. Automatic adjustment of ZeRO's "
               "optimizer state partitioning with a new world size is not currently supported.")]
        return _load_error(sc, t, p, exc, "ZeRO DP world size changed", frames=frames)
    frames = [("/app/megatron/training/checkpointing.py", 1180, "load_checkpoint", ("raise RuntimeError(f\"{mismatch_msg}: "
               "not supported for DistributedOptimizer with sharding type {sharding_type}.\""))]
    exc = [("RuntimeError: (TP, PP) mismatch after resume ((8, 1) vs (4, 2) from checkpoint): not supported for "
           "DistributedOptimizer with sharding type dp_zero_gather_scatter. Please use `--ckpt-convert-format torch_dist "
           "--ckpt-convert-save ...` to convert the checkpoint to the torch_dist format.")]
    return _load_error(sc, t, p, exc, "Megatron TP/PP changed", frames=frames)


@story("deepspeed_universal_checkpoint_sort", "all")
def deepspeed_universal_checkpoint_sort(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    t = sc.ds(t, p, "I", "engine.py:3010:load_checkpoint", "Loading universal checkpoint from /ckpt/global_step1000_universal")
    param = "module.decoder.layers.3.mlp.linear_fc2.weight"
    frames: list[Frame] = [(env.lib("deepspeed/runtime/engine.py"), 3116, "_load_universal_checkpoint",
                            "self.optimizer.load_universal_checkpoint(load_path)"),
                           (env.lib("deepspeed/checkpoint/universal_checkpoint.py"), 95, "load_hp_checkpoint_state",
                            "assert full_param_numel == tp_world_size * tp_slice_numel, \\")]
    exc = [(f"AssertionError: Loading /ckpt/global_step1000_universal/zero/{param}/fp32.pt full param numel 45088768 != "
           "tensor slice numel 11272192 * tp_world_size 2")]
    return _load_error(sc, t, p, exc, "universal checkpoint slices out of order", frames=frames)


# --- checkpoints: saving ---------------------------------------------------------------------------------


@story("disk_full")
def disk_full(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    step = sc.pick("save_step", [4000, 12000, 2500])
    if sc.pick("full", ["enospc", "quota"]) == "quota":
        path = f"/lustre/proj/ckpt/step_{step}/optimizer.pt"
        frames: list[Frame] = [(env.script, 455, "save_checkpoint", "torch.save(optimizer.state_dict(), path)"),
                               (env.lib("torch/serialization.py"), 849, "save",
                                "with _open_zipfile_writer(f) as opened_zipfile:")]
        exc = [f"OSError: [Errno 122] Disk quota exceeded: '{path}'"]
    else:
        tr = env.lib("transformers/trainer.py")
        frames = [(tr, 2245, "train", "return inner_training_loop("),
                  (tr, 3042, "_maybe_log_save_evaluate", "self._save_checkpoint(model, trial)"),
                  (tr, 3147, "_save_checkpoint", "self.state.save_to_json(os.path.join(output_dir, TRAINER_STATE_NAME))"),
                  (env.lib("transformers/trainer_callback.py"), 145, "save_to_json", "f.write(json_string)")]
        exc = ["OSError: [Errno 28] No space left on device"]
    sc.pylog(t - 1.5, p, f"Saving model checkpoint to /checkpoints/run-17/checkpoint-{step}", level="I",
             logger="transformers.trainer")
    sc.rank(t, p, traceback(frames, exc))
    return Outcome(exc[0], story="quota" if "122" in exc[0] else "ENOSPC")


@story("torch_save_failed")
def torch_save_failed(sc: Stage, t: float, p: Process) -> Outcome:
    """A sharded save: each rank writes its own shard; this rank's node lacks the shared mount."""
    env = sc.env
    folder = f"/checkpoints/run-17/step_{sc.pick('save_step', [4000, 12000])}"
    frames: list[Frame] = [(env.script, 455, "save_checkpoint", f"torch.save(shard, f\"{folder}/shard_{{rank}}.pt\")"),
                           (env.lib("torch/serialization.py"), 849, "save", "with _open_zipfile_writer(f) as opened_zipfile:"),
                           (env.lib("torch/serialization.py"), 716, "__init__",
                            "super().__init__(torch._C.PyTorchFileWriter(self.name))")]
    exc = sc.pick("save", [[f"RuntimeError: Parent directory {folder} does not exist."],
                           [f"RuntimeError: File {folder}/shard_{p.rank}.pt cannot be opened."]])
    if exc[0].startswith("RuntimeError: File"):
        exc = [f"RuntimeError: File {folder}/shard_{p.rank}.pt cannot be opened."]
    sc.rank(t, p, traceback(frames, exc))
    return Outcome(exc[0], story="shard target unwritable")


@story("deepspeed_checkpoint_hang")
def deepspeed_checkpoint_hang(sc: Stage, t: float, p: Process) -> Outcome:
    """DeepSpeed's decoupled checkpoint engine: the background writer never commits; after its 300 s
    timeout the rank gives up."""
    env = sc.env
    tag = f"global_step{sc.pick('save_step', [1200, 3600])}"
    sc.ds(t - 300.0, p, "I", "decoupled_checkpoint_engine.py:148:create", f"[DecoupledCheckpointEngine] Checkpoint {tag} "
                                                                           "is about to be saved!")
    text = "[DecoupledCheckpointEngine] Checkpoint commit timed out after 300 seconds"
    t = sc.ds(t, p, "E", "decoupled_checkpoint_engine.py:211:commit", text)
    frames: list[Frame] = [(env.lib("deepspeed/runtime/engine.py"), 3390, "save_checkpoint",
                            "self.checkpoint_engine.commit(tag)"),
                           (env.lib("deepspeed/runtime/checkpoint_engine/decoupled_checkpoint_engine.py"), 214, "commit",
                            "raise RuntimeError(f\"[{ENGINE_NAME}] Checkpoint commit timed out after {timeout} seconds\")")]
    sc.rank(t, p, traceback(frames, [f"RuntimeError: {text}"]))
    return Outcome(text, story="decoupled commit timeout")


@story("deepspeed_fd_leak_enospc")
def deepspeed_fd_leak_enospc(sc: Stage, t: float, p: Process) -> Outcome:
    """FastFileWriter leaks a descriptor per file; at the Nth checkpoint open() fails."""
    env = sc.env
    path = f"/local_nvme/ckpt/global_step{sc.pick('save_step', [3600, 7200])}/layer_17-model_00-model_states.pt"
    frames: list[Frame] = [(env.lib("deepspeed/runtime/checkpoint_engine/fast_checkpoint_engine.py"), 32, "save",
                            "torch.save(state_dict, path)"),
                           (env.lib("deepspeed/io/fast_file_writer.py"), 62, "__init__",
                            "self._fd = os.open(file_path, flags)")]
    exc = sc.pick("fd", [[f"OSError: [Errno 24] Too many open files: '{path}'"],
                         [f"OSError: [Errno 28] No space left on device: '{path}'"]])
    sc.rank(t, p, traceback(frames, exc))
    return Outcome(exc[0], story="FastFileWriter fd leak")


@story("deepspeed_sigbus_after_load", accepted=("shm_exhausted",))
def deepspeed_sigbus_after_load(sc: Stage, t: float, p: Process) -> Outcome:
    """Every rank loads its ZeRO partitions (memory-mapped); the rank whose mapped file shrank gets SIGBUS."""
    n = sc.world_size
    for q in sc.procs:
        sc.ds(t - 3.0 + sc.jitter(0.5), q, "I", "engine.py:3157:_load_zero_checkpoint",
              f"loading {n} zero partition checkpoints for rank {q.rank}")
    lines = ["Fatal Python error: Bus error", "", "Current thread 0x00007f9c2b7fe740 (most recent call first):",
             f'  File "{sc.env.lib("torch/serialization.py")}", line 1555 in load_tensor',
             f'  File "{sc.env.lib("deepspeed/runtime/engine.py")}", line 3151 in _get_all_zero_checkpoint_state_dicts']
    sc.rank(t, p, lines)
    return Outcome(lines[0], exitcode=-7, immediate=True, story="SIGBUS reading a mapped partition")


@story("distcheckpoint_async_timeout")
def distcheckpoint_async_timeout(sc: Stage, t: float, p: Process) -> Outcome:
    env = sc.env
    if sc.pick("async", ["dcp", "megatron"]) == "megatron":
        text = "Local worker 3 encountered an error: [Errno 5] Input/output error"
        sc.pylog(t, p, text, level="E", logger="megatron.core.dist_checkpointing.strategies.filesystem_async")
        frames: list[Frame] = [("/app/megatron/core/dist_checkpointing/strategies/async_utils.py", 212,
                                "maybe_finalize_async_calls", "finalize_fn()"),
                               ("/app/megatron/core/dist_checkpointing/strategies/filesystem_async.py", 402,
                                "retrieve_write_results", ('raise RuntimeError(f"Worker failure: {write_results_or_exc}") '
                                                          "from write_results_or_exc"))]
        sc.rank(t + 0.3, p, traceback(frames, ["RuntimeError: Worker failure: [Errno 5] Input/output error"]))
        return Outcome(text, story="Megatron async writer failed")
    frames = [(env.script, 470, "save_checkpoint", "self._future = dcp.async_save(state, checkpoint_id=path)"),
              (env.lib("torch/distributed/checkpoint/_async_process_executor.py"), 196, "_wait_for_response",
               "raise RuntimeError(")]
    exc = [f"RuntimeError: Timed out after 600s while waiting for response from checkpointer process pid: {p.pid + 77}"]
    sc.rank(t, p, traceback(frames, exc))
    return Outcome(exc[0], story="DCP checkpointer process unresponsive")


@story("tensorrt_llm_weight_mapper", "serve_all")
def tensorrt_llm_weight_mapper(sc: Stage, t: float, p: Process) -> Outcome:
    """trtllm-serve on an FP8 checkpoint whose scale tensors the weight mapper does not find (every MPI rank)."""
    key = sc.pick("trt_key", ["model.layers.0.self_attn.qkv_proj.weight_scale", "model.layers.0.mlp.gate_up_proj.input_scale"])
    text = f"Failed to initialize executor on rank {p.rank}: '{key}'"
    t = sc.trtllm(t, p, "E", text)
    sc.raw(t, p.host, traceback(
        [(sc.env.lib("tensorrt_llm/executor/worker.py"), 779, "worker_main", "worker: GenerationExecutorWorker = worker_cls("),
         (sc.env.lib("tensorrt_llm/_torch/models/modeling_utils.py"), 680, "load_weights",
          "module_weights = filter_weights(name, weights)"),
         (sc.env.lib("tensorrt_llm/_torch/models/checkpoints/hf/weight_mapper.py"), 88, "handle_manual_copy",
          "module_weights[new_name] = weights[key]")], [f"KeyError: '{key}'"]))
    return Outcome(text, story="FP8 scales missing for the weight mapper")
