"""An `Engine` backed by an SGLang server over HTTP (token in, token out, with log-probs).

Talks only to the server's native API; the `sglang` package is never imported.

  generate         POST /generate, one request per prompt, at most `max_concurrency` in flight
                   (the server batches them continuously). Sends `input_ids` and reads
                   `output_ids` and `meta_info.output_token_logprobs`, so no text is ever
                   re-tokenised.
  update_weights   exports the model as an HF safetensors directory (one per version, the last
                   `keep_versions` kept; only directories whose export manifest
                   names the version, `VERSION_KEY`, are ever deleted) and POSTs
                   /update_weights_from_disk. The directory
                   must be readable by the server at the same path (same machine or a shared
                   filesystem; not a bucket URL). sglang-jax has no such endpoint: there,
                   restart the server on the exported directory instead. Multi-host: every
                   process calls it (the export gathers the sharded parameters), process 0
                   writes the files, all wait at a barrier, then process 0 alone POSTs and
                   tells the others whether the server loaded them.
                   With `weight_sync="tensor"` (a server on the same node) nothing is
                   written: the HF-named tensors go in the bodies of POST
                   /update_weights_from_tensor, in buckets of at most `tensor_bucket_bytes`
                   (`tensor_payload`; the cache is flushed and the version set with the last
                   one). A server without that endpoint (HTTP 404, sglang-jax) is synced
                   through the disk export from then on, with a warning. `last_sync_bytes`:
                   the bytes the last sync moved (export files or request bodies).
  health / flush_cache / model_info   GET /health, POST /flush_cache, GET /get_model_info.

What the request asks of the server, and why (SGLang's `GenerateReqInput` / `SamplingParams`):
  sampling_params.top_k = -1 when our top_k is 0 (SGLang's "no truncation"; it rejects 0).
  sampling_params.skip_special_tokens = false   otherwise sampled special tokens vanish from
                                                `output_ids` (sglang-jax filters them out).
  sampling_params.no_stop_trim = true           otherwise the matched stop token is cut from
                                                `output_ids`; our contract keeps it.
  sampling_params.sampling_seed = request.seed  per-request seed. Honoured only when the server
                                                runs deterministic sampling (sglang-jax:
                                                --enable-deterministic-sampling, passed by
                                                experiments/sglang/launch_server.sh; CUDA SGLang:
                                                --enable-deterministic-inference); ignored
                                                otherwise.
  return_logprob = true, logprob_start_len = -1  log-probs of the output tokens only.

Semantics the caller should know:
  * The server also stops at the model's own EOS ids (config / generation_config /
    tokenizer), whether or not they are in `stop_token_ids`: SGLang's only switch for that,
    `ignore_eos`, disables `stop_token_ids` as well. Such a stop is reported as "stop".
  * The log-probs are those of the server's sampling distribution: log-softmax of the logits
    divided by the temperature (before top-k/top-p truncation); raw log-softmax when greedy.
  * A /generate retried after a timeout may leave the first attempt running on the server:
    wasted work, not a wrong result (the retry is a fresh, equally valid sample).
  * sglang-jax repeats earlier snapshots in `output_token_logprobs` once an output exceeds
    ~50 tokens; the last `completion_tokens` entries are the right ones, and their token ids
    are checked against `output_ids`.
  * A reply is validated before anything uses it: at least one token (the stop token is
    kept, so even a reply that stops at once has one), every token id inside the vocabulary
    (`vocab_size`), every log-prob finite and <= 0 (up to `LOGPROB_SLACK` of rounding), no more
    tokens than `max_new_tokens`, one log-prob per token. A reply that fails is asked for again
    (a fresh sample), like a transient HTTP failure; a request that still fails after its
    retries is reported by `generate` as `GenerationFailed` carrying every other result, so
    the caller drops the groups it spoils instead of training on part of one.
  * `generate_counted` returns, with one call's results, the attempts it retried and the
    requests it gave up on (`EngineFaults`; the pipelines log them per step); the retries of
    other calls (a weight sync, a cache flush) are only logged.
"""
from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import re
import shutil
import threading
import time
from typing import Any, Mapping, Sequence

from rised_jax import http_retry
from rised_jax.rollout.base import (EngineDefaults, EngineFaults, Generation, GenerationFailed,
                                    GenerationRequest, GenerationResult, StopCheck)
from rised_jax.checks import is_http_url, is_int, is_number

log = logging.getLogger(__name__)
_VERSION_DIR = re.compile(r"^v(\d+)$")
# Written into every version directory an export creates: pruning and re-exporting delete only
# directories that hold it, never a `v<N>` someone else put in weight_dir.
# The export manifest's key (model.hf_io.export_manifest) naming the weights version a weight
# sync wrote: pruning deletes only directories that carry it.
VERSION_KEY = "weight_sync_version"
# A log-prob may exceed 0 by this much (float32 rounding of a log-softmax near 0), no more.
LOGPROB_SLACK = 1e-4


class SGLangError(RuntimeError):
  """The SGLang server could not be used: unreachable, refused a request, or answered
  something that does not follow its documented schema."""


class SGLangGenerationFailed(SGLangError, GenerationFailed):
  """Some /generate requests of one `generate` call failed after their retries."""


def build_generate_payload(request: GenerationRequest) -> dict[str, Any]:
  """The JSON body of POST /generate for one request (see the module docstring)."""
  params = request.params
  return {
      "input_ids": [int(t) for t in request.prompt_ids],
      "sampling_params": {
          "max_new_tokens": int(params.max_new_tokens),
          "temperature": float(params.temperature),
          "top_p": float(params.top_p),
          "top_k": int(params.top_k) if params.top_k > 0 else -1,
          "stop_token_ids": [int(t) for t in params.stop_token_ids],
          "skip_special_tokens": False,
          "no_stop_trim": True,
          "sampling_seed": int(request.seed),
      },
      "return_logprob": True,
      "logprob_start_len": -1,
  }


def _non_token_ids(values: Sequence[Any]) -> list[Any]:
  """The entries that are not non-negative integers (Python or NumPy; bools excluded)."""
  return [v for v in values
          if not is_int(v) or v < 0]


def validate_request(request: GenerationRequest, index: int = 0) -> None:
  """Raises ValueError naming the request and the field when a request cannot be sent."""
  where = f"generation request {index}"
  prompt = list(request.prompt_ids)
  if not prompt:
    raise ValueError(f"{where}: prompt_ids is empty; SGLang needs at least one input token")
  if bad := _non_token_ids(prompt):
    raise ValueError(f"{where}: prompt_ids must be non-negative integers, got {bad[:5]!r}")
  params = request.params
  if _non_token_ids([params.max_new_tokens]) or params.max_new_tokens < 1:
    raise ValueError(f"{where}: max_new_tokens must be an integer >= 1, "
                     f"got {params.max_new_tokens!r}")
  if not (math.isfinite(params.temperature) and params.temperature >= 0):
    raise ValueError(f"{where}: temperature must be finite and >= 0, got {params.temperature!r}")
  if not 0 < params.top_p <= 1:
    raise ValueError(f"{where}: top_p must be in (0, 1], got {params.top_p!r}")
  if params.top_k < 0:
    raise ValueError(f"{where}: top_k must be >= 0 (0: no truncation), got {params.top_k!r}")
  if _non_token_ids(params.stop_token_ids):
    raise ValueError(f"{where}: stop_token_ids must be non-negative, "
                     f"got {params.stop_token_ids!r}")
  if not -2**31 <= int(request.seed) < 2**31:
    # sglang-jax holds the seeds in an int32 array.
    raise ValueError(f"{where}: seed must fit in int32, got {request.seed!r}")


def _finish_reason(meta_info: Mapping[str, Any], where: str) -> str:
  """SGLang's finish_reason ({"type": "stop"|"length"|"abort", …} or a bare string) as
  "stop" or "length"; an aborted request is an error."""
  reason = meta_info.get("finish_reason")
  kind = reason.get("type") if isinstance(reason, Mapping) else reason
  if kind in ("stop", "length"):
    return kind
  if kind == "abort":
    message = reason.get("message") if isinstance(reason, Mapping) else None
    raise SGLangError(f"{where}: the server aborted the request: {message or repr(reason)}")
  raise SGLangError(f"{where}: meta_info.finish_reason is {reason!r}; expected a type of "
                    "'stop' or 'length' (was the request finished?)")


def parse_generate_response(response: Any, where: str = "/generate", *,
                            max_new_tokens: int | None = None,
                            vocab_size: int | None = None) -> GenerationResult:
  """Reads `output_ids`, `meta_info.output_token_logprobs` and `meta_info.finish_reason`
  from one /generate response, checking that they agree and are possible (module docstring;
  the token bounds when `max_new_tokens` / `vocab_size` are given); SGLangError otherwise."""
  if not isinstance(response, Mapping):
    raise SGLangError(f"{where}: expected a JSON object, got {type(response).__name__}")
  output_ids = response.get("output_ids")
  if not isinstance(output_ids, list) or not all(
      is_int(t) for t in output_ids):
    raise SGLangError(
        f"{where}: response has no integer list 'output_ids' (got {output_ids!r:.200}); "
        "the client needs a server that returns output_ids (SGLang >= 0.4 native /generate)")
  if not output_ids:
    # We ask for no_stop_trim, so even a reply that stops at once holds its stop token: a
    # reply without a token is one the server broke (and no turn can be built from it).
    raise SGLangError(f"{where}: output_ids is empty; a reply holds at least one token (the "
                      "stop token is kept: no_stop_trim=true)")
  if max_new_tokens is not None and len(output_ids) > max_new_tokens:
    raise SGLangError(f"{where}: {len(output_ids)} output tokens for max_new_tokens="
                      f"{max_new_tokens}")
  if bad := [(i, t) for i, t in enumerate(output_ids)
             if t < 0 or (vocab_size is not None and t >= vocab_size)][:3]:
    bound = "" if vocab_size is None else f" [0, {vocab_size})"
    raise SGLangError(f"{where}: output_ids{''.join(f'[{i}]={t}' for i, t in bad)} outside the "
                      f"vocabulary{bound}")
  meta_info = response.get("meta_info")
  if not isinstance(meta_info, Mapping):
    raise SGLangError(f"{where}: response has no 'meta_info' object")
  completion_tokens = meta_info.get("completion_tokens")
  if not isinstance(completion_tokens, int) or completion_tokens != len(output_ids):
    raise SGLangError(
        f"{where}: meta_info.completion_tokens={completion_tokens!r} but output_ids has "
        f"{len(output_ids)} tokens (special tokens dropped or a stop token trimmed?)")
  entries = meta_info.get("output_token_logprobs")
  if not isinstance(entries, list) or len(entries) < completion_tokens:
    count = len(entries) if isinstance(entries, list) else entries
    raise SGLangError(
        f"{where}: meta_info.output_token_logprobs has {count!r} entries for "
        f"{completion_tokens} output tokens (was return_logprob honoured?)")
  # sglang-jax may prepend earlier snapshots: the last completion_tokens entries are current.
  entries = entries[len(entries) - completion_tokens:]
  logprobs = []
  for position, (entry, token) in enumerate(zip(entries, output_ids)):
    if (not isinstance(entry, (list, tuple)) or len(entry) < 2 or
        not is_number(entry[0], finite=False)):
      raise SGLangError(f"{where}: output_token_logprobs[{position}] is {entry!r}; "
                        "expected [logprob, token_id, text]")
    if entry[1] != token:
      raise SGLangError(
          f"{where}: output_token_logprobs[{position}] is for token {entry[1]!r} but "
          f"output_ids[{position}] is {token}; the server's outputs disagree")
    logprob = float(entry[0])
    if not (math.isfinite(logprob) and logprob <= LOGPROB_SLACK):
      raise SGLangError(f"{where}: output_token_logprobs[{position}] is {logprob!r}; a "
                        "log-probability is finite and <= 0")
    logprobs.append(logprob)
  return GenerationResult(output_ids=list(output_ids), logprobs=logprobs,
                          finish_reason=_finish_reason(meta_info, where))


def _is_export(path: str) -> bool:
  """Whether `path` is a version directory a weight sync wrote (its export manifest names
  the version)."""
  from rised_jax.model.hf_io import export_manifest  # noqa: PLC0415 (the model stack: JAX)
  manifest = export_manifest(path)
  return manifest is not None and is_int(manifest.get(VERSION_KEY))


WEIGHT_SYNCS = ("disk", "tensor")


class _FaultTally:
  """The faults of one `generate` call, counted from its worker threads."""

  def __init__(self):
    self._lock = threading.Lock()
    self._retries = self._failed = 0

  def retried(self) -> None:
    with self._lock:
      self._retries += 1

  def failed(self) -> None:
    with self._lock:
      self._failed += 1

  def counts(self) -> EngineFaults:
    with self._lock:
      return EngineFaults(server_retries=self._retries, failed_requests=self._failed)


class SGLangEngine(EngineDefaults):
  """Token-in, token-out generation on an SGLang server; see the module docstring.

  Args:
    base_url: the server, e.g. "http://127.0.0.1:30000".
    max_concurrency: most /generate requests in flight at once (across all callers).
    timeout_s: deadline of one HTTP call as a whole (connect, send, the full answer).
    max_retries: retries of a call after a transient failure (connection error, deadline,
      HTTP 408/429/5xx, truncated or invalid JSON, a /generate reply that fails validation),
      with jittered exponential backoff from `backoff_s` (at most `max_backoff_s`) and the
      server's Retry-After honoured (`http_retry`). Other 4xx answers are never retried.
    vocab_size: the policy's vocabulary; a reply with a token id outside it is invalid
      (None: only negative ids are).
    weight_dir: where `update_weights` writes one `v<version>` directory per version; it
      must be readable by the server at the same path.
    tokenizer: written next to the weights (the exporter needs it).
    export_dtype: dtype of the exported weights (None: the exporter's default).
    weight_sync: "disk" (export, then /update_weights_from_disk; any server that can read
      `weight_dir`) or "tensor" (the weights in /update_weights_from_tensor bodies; a server
      on the same node, no disk); see the module docstring.
    tensor_bucket_bytes: the most raw tensor bytes in one /update_weights_from_tensor body.
    keep_versions: how many exported versions stay on disk (the loaded one always stays).
    max_reply_bytes: the largest reply body read (`http_retry`); a larger reply fails its
      request (not retried: the same request gets the same reply).
  """

  def __init__(self, base_url: str, *, max_concurrency: int = 8, timeout_s: float = 600.0,
               max_retries: int = 3, backoff_s: float = 0.5, max_backoff_s: float = 30.0,
               vocab_size: int | None = None, weight_dir: str | None = None,
               tokenizer: Any = None, export_dtype: str | None = None, keep_versions: int = 2,
               max_reply_bytes: int = http_retry.DEFAULT_MAX_REPLY_BYTES,
               weight_sync: str = "disk", tensor_bucket_bytes: int = 512 << 20):
    if not is_http_url(base_url):
      raise ValueError(f"SGLangEngine base_url must look like http://HOST:PORT, got {base_url!r}")
    if max_concurrency < 1:
      raise ValueError(f"SGLangEngine max_concurrency must be >= 1, got {max_concurrency}")
    if not timeout_s > 0:
      raise ValueError(f"SGLangEngine timeout_s must be > 0, got {timeout_s}")
    if keep_versions < 1:
      raise ValueError(f"SGLangEngine keep_versions must be >= 1, got {keep_versions}")
    if weight_sync not in WEIGHT_SYNCS:
      raise ValueError(f"SGLangEngine weight_sync must be one of {WEIGHT_SYNCS}, got "
                       f"{weight_sync!r}")
    if not is_int(tensor_bucket_bytes) or tensor_bucket_bytes < 1:
      raise ValueError(f"SGLangEngine tensor_bucket_bytes must be an integer >= 1, got "
                       f"{tensor_bucket_bytes!r}")
    if vocab_size is not None and vocab_size < 1:
      raise ValueError(f"SGLangEngine vocab_size must be >= 1 or None, got {vocab_size}")
    if weight_dir is not None and "://" in os.fspath(weight_dir):
      raise ValueError(f"SGLangEngine weight_dir={os.fspath(weight_dir)!r}: the server loads "
                       "exports from a filesystem path, not a URL; give a local or shared "
                       "directory (config.rollout.sglang.weight_dir when the workdir is a "
                       "bucket)")
    self.max_reply_bytes = http_retry.check_max_reply_bytes("SGLangEngine", max_reply_bytes)
    self.base_url = base_url.rstrip("/")
    self.max_concurrency = max_concurrency
    self.timeout_s = float(timeout_s)
    self.retry_policy = http_retry.RetryPolicy(max_retries=max_retries, backoff_s=backoff_s,
                                               max_backoff_s=max_backoff_s)
    self.vocab_size = vocab_size
    self.weight_dir = None if weight_dir is None else os.path.abspath(weight_dir)
    self.tokenizer = tokenizer
    self.export_dtype = export_dtype
    self.keep_versions = keep_versions
    self.weight_version: int | None = None   # the version the server last loaded through us
    self.weight_sync = weight_sync
    self.tensor_bucket_bytes = int(tensor_bucket_bytes)
    self.last_sync_bytes = 0
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=max_concurrency, thread_name_prefix="sglang-client")
    self._lacks_weight_endpoint = False
    self._weights_lock = threading.Lock()

  # -- plumbing ---------------------------------------------------------------------------

  def _url(self, path: str) -> str:
    return f"{self.base_url}{path}"

  def _retry(self, call, faults: _FaultTally | None = None):
    def on_retry(error: BaseException, wait_s: float) -> None:
      if faults is not None:
        faults.retried()
      log.info("SGLang: retry in %.2f s after: %s", wait_s, error)
    return http_retry.call_with_retry(call, self.retry_policy, on_retry=on_retry)

  def _call_json(self, method: str, path: str, payload: Any = None) -> Any:
    return self._retry(lambda: http_retry.request_json(
        method, self._url(path), payload, timeout_s=self.timeout_s,
        max_reply_bytes=self.max_reply_bytes))

  def close(self) -> None:
    """Waits for in-flight requests and releases the worker threads."""
    self._pool.shutdown(wait=True)

  def __enter__(self) -> SGLangEngine:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  # -- server state -----------------------------------------------------------------------

  def health(self) -> bool:
    """True when GET /health answers 200; False when the server is down or unhealthy.
    One try, no retries: this is what a caller polls."""
    try:
      http_retry.request("GET", self._url("/health"), timeout_s=min(self.timeout_s, 5.0),
                         max_reply_bytes=self.max_reply_bytes)
    except http_retry.HTTPRequestError:
      return False
    return True

  def wait_until_healthy(self, timeout_s: float, poll_s: float = 0.5) -> None:
    """Polls /health until it answers 200; SGLangError after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while not self.health():
      if time.monotonic() > deadline:
        raise SGLangError(f"SGLang server at {self.base_url} not healthy after {timeout_s:g} s "
                          "(GET /health); is it running, and has it finished loading?")
      time.sleep(poll_s)

  def flush_cache(self) -> None:
    """Empties the server's prefix (radix) cache. SGLang refuses (HTTP 400) while requests
    are running or queued; that is an SGLangError."""
    try:
      self._retry(lambda: http_retry.request("POST", self._url("/flush_cache"),
                                             timeout_s=self.timeout_s,
                                             max_reply_bytes=self.max_reply_bytes))
    except http_retry.HTTPRequestError as error:
      raise SGLangError(f"SGLang did not flush its cache: {error} (the server refuses while "
                        "requests are in flight; call it between generate() batches)") from error

  def model_info(self) -> dict[str, Any]:
    """GET /get_model_info: model_path, tokenizer_path, is_generation, …"""
    try:
      info = self._call_json("GET", "/get_model_info")
    except http_retry.HTTPRequestError as error:
      raise SGLangError(f"SGLang /get_model_info failed: {error}") from error
    if not isinstance(info, dict):
      raise SGLangError(f"SGLang /get_model_info answered {info!r}; expected a JSON object")
    return info

  # -- generation -------------------------------------------------------------------------

  def _generate_one(self, index: int, request: GenerationRequest,
                    faults: _FaultTally) -> GenerationResult:
    where = f"SGLang /generate (request {index})"
    url = self._url("/generate")
    payload = build_generate_payload(request)

    def attempt() -> GenerationResult:
      response = http_retry.request_json("POST", url, payload, timeout_s=self.timeout_s,
                                         max_reply_bytes=self.max_reply_bytes)
      try:
        return parse_generate_response(response, where,
                                       max_new_tokens=request.params.max_new_tokens,
                                       vocab_size=self.vocab_size)
      except SGLangError as invalid:   # asked again: the next sample may be sound
        raise http_retry.HTTPRequestError("POST", url, 200, f"invalid reply: {invalid}",
                                          retryable=True) from invalid

    try:
      return self._retry(attempt, faults)
    except http_retry.HTTPRequestError as error:
      faults.failed()
      raise SGLangError(f"{where} failed: {error}") from error

  def generate(self, requests: Sequence[GenerationRequest], *, shared_prefill: bool = False,
               stop_check: StopCheck | None = None) -> list[GenerationResult]:
    """Results in request order; the savings are the server's own (its radix cache shares
    prompt prefixes; a reply runs to its stop ids), so `shared_prefill` and `stop_check` are
    not used. All requests are validated before any is sent. When some
    fail (after their retries), the others still finish and `SGLangGenerationFailed` is
    raised with them (None where a request failed) and the first failure in its message; an
    unexpected error (a bug) cancels the requests not yet sent and propagates."""
    del shared_prefill, stop_check
    results, errors, _ = self._generate_all(requests)
    if errors:
      raise SGLangGenerationFailed(
          f"{len(errors)} of {len(requests)} SGLang requests failed after their retries; "
          f"first: {errors[0]}", results=results)
    return results

  def generate_counted(self, requests: Sequence[GenerationRequest], *,
                       shared_prefill: bool = False,
                       stop_check: StopCheck | None = None) -> Generation:
    """`generate`'s results (None where a request failed) with the faults this call met."""
    del shared_prefill, stop_check
    results, _, faults = self._generate_all(requests)
    return Generation(tuple(results), faults)

  def _generate_all(self, requests: Sequence[GenerationRequest]
                    ) -> tuple[list[GenerationResult | None], list[SGLangError], EngineFaults]:
    for index, request in enumerate(requests):
      validate_request(request, index)
    faults = _FaultTally()
    futures = [self._pool.submit(self._generate_one, index, request, faults)
               for index, request in enumerate(requests)]
    results: list[GenerationResult | None] = []
    errors: list[SGLangError] = []
    try:
      for future in futures:
        try:
          results.append(future.result())
        except SGLangError as error:
          results.append(None)
          errors.append(error)
    except BaseException:
      for future in futures:
        future.cancel()
      raise
    return results, errors, faults.counts()

  # -- weight sync ------------------------------------------------------------------------

  def export_weights(self, model: Any, version: int) -> str:
    """Writes `model` (and the tokenizer) to `<weight_dir>/v<version>` and returns the path.
    The directory appears complete or not at all (written aside, then renamed). Multi-host:
    every process calls it; process 0 alone writes."""
    if self.weight_dir is None or self.tokenizer is None:
      raise SGLangError("SGLangEngine weight export needs weight_dir= and tokenizer= (the "
                        "server reloads weights from a directory it can read)")
    if not is_int(version) or version < 0:
      raise ValueError(f"weight version must be an integer >= 0, got {version!r}")
    # The model stack (JAX), only when exporting.
    from rised_jax import parallel  # noqa: PLC0415
    from rised_jax.model import save_pretrained  # noqa: PLC0415
    target = os.path.join(self.weight_dir, f"v{version}")
    # The same name on every process: only process 0 uses it, but all must agree on it.
    staging = os.path.join(self.weight_dir, f".staging-v{version}")
    export_kwargs = {"note": {VERSION_KEY: version}}
    if self.export_dtype is not None:
      export_kwargs["dtype"] = self.export_dtype

    def clear_staging():
      shutil.rmtree(staging, ignore_errors=True)   # left by an interrupted export

    def publish():
      if os.path.isdir(target):
        if not _is_export(target):
          raise SGLangError(f"{target} exists and was not written by a weight sync (its "
                            f"export manifest names no {VERSION_KEY}); it is left alone: "
                            "move it, or give "
                            "config.rollout.sglang.weight_dir a directory of its own")
        shutil.rmtree(target)
      os.rename(staging, target)

    parallel.on_coordinator(clear_staging, f"clearing {staging}", SGLangError)
    try:
      save_pretrained(model, self.tokenizer, staging, **export_kwargs)
      parallel.on_coordinator(publish, f"renaming {staging} to {target}", SGLangError)
    finally:
      if parallel.is_coordinator():
        clear_staging()
    return target

  def update_weights(self, model: Any, version: int) -> None:
    """Makes the server serve `model` as version `version` (flushing its cache): by disk
    export (then deletes all but the newest `keep_versions` exported versions) or by tensor
    (module docstring). Multi-host: every process calls it; process 0 alone talks to the
    server, after every process has taken part in gathering the parameters, and all return
    (or raise) together."""
    if not is_int(version) or version < 0:
      raise ValueError(f"weight version must be an integer >= 0, got {version!r}")
    with self._weights_lock:
      if self.weight_sync == "tensor":
        self._update_from_tensors(model, version)
      else:
        self._update_from_disk(model, version)
      self.weight_version = version

  def _update_from_disk(self, model: Any, version: int) -> None:
    from rised_jax import parallel  # noqa: PLC0415
    if self._lacks_weight_endpoint:
      raise SGLangError(self._no_weight_endpoint_message(None))
    path = self.export_weights(model, version)
    parallel.barrier(f"SGLang weights v{version} written")
    parallel.on_coordinator(lambda: self._load_on_server(path, version),
                            f"SGLang loading weights version {version}", SGLangError)
    self.last_sync_bytes = sum(os.path.getsize(os.path.join(path, name))
                               for name in os.listdir(path)) if os.path.isdir(path) else 0

  def _update_from_tensors(self, model: Any, version: int) -> None:
    from rised_jax import parallel  # noqa: PLC0415
    from rised_jax.model.hf_io import EXPORT_DTYPES, hf_tensors  # noqa: PLC0415
    dtype = EXPORT_DTYPES[self.export_dtype or "float32"]
    # Every process takes part in the gathers; process 0 alone keeps the tensors.
    named = {name: array for name, array in hf_tensors(model, dtype)
             if parallel.is_coordinator()}
    lacks_endpoint = parallel.on_coordinator(
        lambda: self._post_tensors(named, version),
        f"SGLang loading weights version {version} by tensor", SGLangError)
    if parallel.allgather_objects(lacks_endpoint)[0]:   # process 0's answer, on every process
      log.warning("SGLang at %s has no POST /update_weights_from_tensor (HTTP 404); syncing "
                  "weights through the disk export in %s instead", self.base_url,
                  self.weight_dir)
      self.weight_sync = "disk"
      self._update_from_disk(model, version)

  def _post_tensors(self, named: Mapping[str, Any], version: int) -> bool:
    """POSTs the tensors bucket by bucket; True when the server lacks the endpoint."""
    from rised_jax.rollout import tensor_payload  # noqa: PLC0415
    buckets = tensor_payload.buckets(named, self.tensor_bucket_bytes)
    sent = 0
    for index, bucket in enumerate(buckets):
      last = index == len(buckets) - 1
      payload = {"serialized_named_tensors": [tensor_payload.serialized_entry(bucket)],
                 "load_format": None, "flush_cache": last, "abort_all_requests": False}
      if last:
        payload["weight_version"] = str(version)
      sent += len(payload["serialized_named_tensors"][0])
      try:
        answer = self._call_json("POST", "/update_weights_from_tensor", payload)
      except http_retry.HTTPRequestError as error:
        if error.status == 404 and index == 0:
          return True
        raise SGLangError(f"SGLang did not load weights version {version} (tensor bucket "
                          f"{index + 1} of {len(buckets)}): {error}") from error
      if not isinstance(answer, dict) or answer.get("success") is not True:
        message = answer.get("message") if isinstance(answer, dict) else answer
        raise SGLangError(f"SGLang did not load weights version {version} (tensor bucket "
                          f"{index + 1} of {len(buckets)}): {message!r}")
    self.last_sync_bytes = sent
    return False

  def _load_on_server(self, path: str, version: int) -> None:
    """POST /update_weights_from_disk for the export at `path`, then prune old exports."""
    payload = {
        "model_path": path,
        "load_format": "auto",
        "flush_cache": True,
        "abort_all_requests": False,
        "weight_version": str(version),
    }
    try:
      answer = self._call_json("POST", "/update_weights_from_disk", payload)
    except http_retry.HTTPRequestError as error:
      if error.status == 404:
        # The export stays: restarting the server on it is the way forward.
        self._lacks_weight_endpoint = True
        raise SGLangError(self._no_weight_endpoint_message(path)) from error
      shutil.rmtree(path, ignore_errors=True)
      raise SGLangError(f"SGLang did not load weights version {version} from {path}: "
                        f"{error}") from error
    if not isinstance(answer, dict) or answer.get("success") is not True:
      shutil.rmtree(path, ignore_errors=True)
      message = answer.get("message") if isinstance(answer, dict) else answer
      raise SGLangError(f"SGLang did not load weights version {version} from {path}: "
                        f"{message!r}")
    self._prune_exports(keep=path)

  def _no_weight_endpoint_message(self, exported: str | None) -> str:
    where = "an exported directory" if exported is None else f"the exported {exported}"
    return (f"the SGLang server at {self.base_url} has no POST /update_weights_from_disk "
            "(HTTP 404): sglang-jax lacks it, CUDA SGLang has it. Use a CUDA SGLang server, "
            f"or restart this one on {where} (experiments/sglang/launch_server.sh DIR PORT), "
            "or use the in-process engine for on-policy training.")

  def _prune_exports(self, keep: str) -> None:
    """Deletes exported version directories beyond the newest `keep_versions` (never `keep`,
    never one whose manifest names no version)."""
    versions = sorted(
        (int(match.group(1)), name) for name in os.listdir(self.weight_dir)
        if (match := _VERSION_DIR.match(name))
        and _is_export(os.path.join(self.weight_dir, name)))
    others = [name for _, name in versions if os.path.join(self.weight_dir, name) != keep]
    for name in others[:max(0, len(others) - (self.keep_versions - 1))]:
      shutil.rmtree(os.path.join(self.weight_dir, name), ignore_errors=True)
