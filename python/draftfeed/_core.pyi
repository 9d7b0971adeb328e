"""draftfeed's C++ core"""

from collections.abc import Mapping, Sequence
import os
from typing import Annotated, overload

import numpy
from numpy.typing import NDArray


class FormatError(ValueError):
    pass

def _write_arrow_stream(path: str, columns: Sequence[tuple[str, bool, bool, int, bool]], batches: Sequence[tuple[int, Sequence[tuple[int, int]], Sequence[bytes]]]) -> None: ...

class TokenDataset:
    """A Hugging Face save_to_disk folder read through memory maps."""

    def __len__(self) -> int: ...

    @property
    def num_rows(self) -> int: ...

    @property
    def folder(self) -> str: ...

    @property
    def shards(self) -> list[str]: ...

    @property
    def total_tokens(self) -> int: ...

    @property
    def has_loss_mask(self) -> bool: ...

    @property
    def columns(self) -> dict:
        """Every column's name and Arrow type text, in schema order."""

    def seq_lens(self) -> Annotated[NDArray, dict(shape=(None,), writable=False)]:
        """
        Every row's length (the seq_len column, else input_ids lengths): a read-only int64 view of the dataset's own array.
        """

    def row(self, i: int) -> dict:
        """
        The row's input_ids and loss_mask as read-only arrays of their stored dtype (copies: OSError naming the shard when it shrank under the reader).
        """

    def __getitem__(self, arg: int, /) -> dict: ...

    def input_ids(self, i: int) -> Annotated[NDArray, dict(shape=(None,), writable=False)]: ...

    def loss_mask(self, i: int) -> Annotated[NDArray, dict(shape=(None,), writable=False)]: ...

    @property
    def has_messages(self) -> bool: ...

    def messages_json(self, i: int) -> str:
        """
        The row's `messages` column as JSON text, the same value as `json.dumps(load_from_disk(folder)[i]["messages"])`. FormatError for corrupt data or a type with no JSON form (binary, dictionary, ...), ValueError without the column.
        """

    def split(self, train_ratio: float) -> tuple[DatasetSplit, DatasetSplit]:
        """
        (train, val): rows [0, int(n * train_ratio)) and the rest; ValueError if either is empty.
        """

    def __repr__(self) -> str: ...

class DatasetSplit:
    """A contiguous range of a dataset's rows."""

    def __len__(self) -> int: ...

    @property
    def num_rows(self) -> int: ...

    @property
    def begin(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def dataset(self) -> TokenDataset: ...

    def seq_lens(self) -> Annotated[NDArray, dict(shape=(None,), writable=False)]: ...

    def global_row(self, i: int) -> int:
        """
        The dataset row of this split's row i (hidden-state files use this index).
        """

    def row(self, i: int) -> dict: ...

    def __getitem__(self, arg: int, /) -> dict: ...

    def __repr__(self) -> str: ...

def open_dataset(path: str) -> TokenDataset:
    """Opens a datasets save_to_disk folder (memory-mapped, zero copy)."""

class DatasetWriter:
    """Streams rows into a save_to_disk folder that datasets can load."""

    def __init__(self, path: str, input_ids_int32: bool = False, num_shards: int = 0, total_rows: int = -1, rows_per_batch: int = 1000, max_shard_bytes: int = 524288000, format_type: str = 'torch') -> None: ...

    @overload
    def add_row(self, input_ids: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], loss_mask: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None: ...

    @overload
    def add_row(self, input_ids: Sequence[int], loss_mask: Sequence[int]) -> None: ...

    def finish(self) -> dict: ...

    @property
    def rows(self) -> int: ...

def write_synthetic_dataset(path: str, rows: int, seed: int = 0, min_len: int = 32, max_len: int = 512, vocab: int = 32000, num_shards: int = 0, int32: bool = False) -> dict:
    """
    Writes rows [0, rows) of the deterministic synthetic dataset (see synthetic.h).
    """

def synthetic_row(row: int, seed: int = 0, min_len: int = 32, max_len: int = 512, vocab: int = 32000) -> tuple[Annotated[NDArray[numpy.int64], dict(shape=(None,))], Annotated[NDArray[numpy.int64], dict(shape=(None,))]]:
    """(input_ids, loss_mask) of one synthetic row, computed without a file."""

def default_hidden_states_path(data_path: str | os.PathLike) -> str:
    """the cache folder of a dataset when none is named"""

def load_safetensors(path: str) -> dict:
    """
    Maps a safetensors file and returns {name: read-only numpy array} without copying (BF16 as uint16 bits, F8 as uint8 codes, F6/F4 as raw uint8 bytes). Raises FormatError naming the problem.
    """

def safetensors_metadata(path: str) -> dict[str, str] | None:
    """The file's __metadata__ map, or None when it has none."""

def safetensors_layout(path: str) -> list:
    """[(name, dtype, shape, file offset, nbytes)] in file order."""

def write_safetensors(path: str, tensors: Sequence[tuple[str, str, Sequence[int], bytes]], metadata: Mapping[str, str] | None = None, atomic: bool = True) -> None:
    """
    Writes [(name, dtype name, shape, raw bytes)] in the safetensors package's layout.
    """

def serialize_safetensors(tensors: Sequence[tuple[str, str, Sequence[int], bytes]], metadata: Mapping[str, str] | None = None) -> bytes: ...

class HiddenStateStore:
    """
    The hs_<row>.safetensors cache folder with the producer's lock protocol.
    """

    def __init__(self, root: str, allowed_folders: Sequence[str] = [], lock_timeout: float = 10.0, lock_poll: float = 0.1, probe_locks: bool = False, force_copy_on_adopt: bool = False, layout: str = 'flat') -> None:
        """
        layout: where adopt() and path_for() put files, 'flat' (root/hs_<row>.safetensors) or 'sharded' (root/<row // 1000, 4 digits>/hs_<row>.safetensors); lookup() finds a row's file in either
        """

    @property
    def root(self) -> str: ...

    def path_for(self, row: int) -> str: ...

    def lookup(self, row: int) -> object:
        """
        The cached sample of `row` as {token_ids, hidden_states, hidden_states_dtype, path}, or None when there is no file. Waits for a writer's lock as the reference does.
        """

    def load(self, path: str) -> object: ...

    def adopt(self, row: int, source: str) -> None: ...

    def remove(self, path: str) -> None: ...

    def confine(self, path: str) -> str: ...

def validate_hidden_states(path: str, ids: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], row: int = -1) -> dict:
    """
    Checks a hidden-state file against a row's ids: {ok, problem, message, nan_count, inf_count, per_layer: [(nan, inf)], nonfinite_layers}. Raises FormatError when the file itself is unreadable.
    """

def write_synthetic_hidden_states(root: str, rows: Sequence[Sequence[int]], seed: int = 0, hidden_size: int = 64, layers: int = 4, dtype: str = 'BF16', threads: int = 0) -> tuple[int, int]:
    """Writes hs_<row>.safetensors for every row; returns (files, bytes)."""

def synthetic_hidden_value(seed: int, row: int, position: int, layer: int, h: int) -> float: ...

def hidden_all_finite(bytes: Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu', writable=False)], offset: int, count: int, dtype: str) -> bool: ...

def hidden_count_nonfinite_per_slot(bytes: Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu', writable=False)], rows: int, slots: int, width: int, dtype: str) -> list[tuple[int, int]]: ...

def hidden_finite_kernel() -> str: ...

def hidden_convert_bits(bits: Annotated[NDArray[numpy.uint32], dict(shape=(None,), order='C', device='cpu', writable=False)], op: str) -> list[int]: ...

class SampleSource:
    """
    Where the engine gets hidden states (the cache by default; an online source from draftfeed.online). Pass one as Loader(..., source=...).
    """

    @property
    def description(self) -> str: ...

    def fetch_native(self, row: int, input_ids: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> dict:
        """
        one row through the source (the slower per-sample paths): {ok, reason, message, fatal} and, when ok, the hidden states' dtype name, shape and bytes (a copy)
        """

class Batch:
    """A delivered batch; its tensors view the batch buffer."""

    @property
    def index(self) -> int:
        """the batch's position in the epoch's full plan"""

    @property
    def tokens(self) -> int: ...

    @property
    def planned_samples(self) -> int: ...

    @property
    def used_samples(self) -> int: ...

    @property
    def locally_empty(self) -> bool: ...

    @property
    def failure_count(self) -> int: ...

    @property
    def fatal(self) -> bool:
        """
        a fatal generation failure (LoaderOptions.fatal_failures_in_batch): the run must stop
        """

    @property
    def fatal_message(self) -> str: ...

    @property
    def dropped(self) -> dict:
        """samples dropped from this batch, by reason"""

    @property
    def drop_messages(self) -> list:
        """
        (reason, message) of the first drops of this batch (PipelineOptions::max_drop_examples)
        """

    @property
    def device(self) -> int:
        """
        the CUDA device the batch's memory is on (the device stage), or -1 for host memory
        """

    def tensor_memory(self) -> list:
        """
        [(name, address, bytes)] of every tensor, in layout order (device memory for a device batch)
        """

    @property
    def address(self) -> int:
        """address of the batch buffer (for zero-copy checks)"""

    def torch(self, bf16_as_uint16: bool = False) -> dict:
        """dict of torch tensors viewing the buffer (no copy)"""

    def samples(self) -> list:
        """
        preprocess 'custom': each usable sample, unpacked, as dicts of torch views (plan order), for the user's callable; pack what it returns with pack_samples()
        """

    def empty_sample(self) -> dict:
        """
        the reference's empty sample (zero rows), for a batch whose samples all failed
        """

    def numpy(self) -> dict:
        """dict of numpy arrays viewing the buffer (bf16 as uint16 bits)"""

class LoaderOptions:
    """
    Options of one loader (C++ LoaderOptions), under the Python Loader's names; LoaderOptions(name=value, ...) sets them by name, the others keep C++'s defaults. validate() checks them; validation() gives the validation loader's options of a training run.
    """

    def __init__(self, **kwargs) -> None: ...

    def validate(self) -> None:
        """raises ValueError naming the first bad field"""

    def validation(self) -> LoaderOptions: ...

    @property
    def data_path(self) -> str:
        """a save_to_disk folder"""

    @data_path.setter
    def data_path(self, arg: str | os.PathLike, /) -> None: ...

    @property
    def split(self) -> str:
        """'train', 'val' or 'all'"""

    @split.setter
    def split(self, arg: str, /) -> None: ...

    @property
    def train_ratio(self) -> float: ...

    @train_ratio.setter
    def train_ratio(self, arg: float, /) -> None: ...

    @property
    def rank(self) -> int:
        """data-parallel rank"""

    @rank.setter
    def rank(self, arg: int, /) -> None: ...

    @property
    def world_size(self) -> int:
        """data-parallel ranks"""

    @world_size.setter
    def world_size(self, arg: int, /) -> None: ...

    @property
    def total_seq_len(self) -> int: ...

    @total_seq_len.setter
    def total_seq_len(self, arg: int, /) -> None: ...

    @property
    def hidden_size(self) -> int: ...

    @hidden_size.setter
    def hidden_size(self, arg: int, /) -> None: ...

    @property
    def num_target_layers(self) -> int: ...

    @num_target_layers.setter
    def num_target_layers(self, arg: int, /) -> None: ...

    @property
    def hidden_states_dtype(self) -> str:
        """'bfloat16' or 'float32' (or the torch dtype)"""

    @hidden_states_dtype.setter
    def hidden_states_dtype(self, arg: object, /) -> None: ...

    @property
    def preprocess(self) -> str:
        """
        'none', 'eagle3' (or 'peagle'), 'mtp', or 'custom' (a callable run in Python)
        """

    @preprocess.setter
    def preprocess(self, arg: str, /) -> None: ...

    @property
    def noise(self) -> str:
        """'uniform', 'gaussian' or 'none' (training split only)"""

    @noise.setter
    def noise(self, arg: str, /) -> None: ...

    @property
    def noise_std(self) -> float:
        """0: no noise"""

    @noise_std.setter
    def noise_std(self, arg: float, /) -> None: ...

    @property
    def seed(self) -> int:
        """of the plan and the noise"""

    @seed.setter
    def seed(self, arg: int, /) -> None: ...

    @property
    def truncate(self) -> bool:
        """clip long samples (else drop them)"""

    @truncate.setter
    def truncate(self, arg: bool, /) -> None: ...

    @property
    def max_batches(self) -> int | None: ...

    @max_batches.setter
    def max_batches(self, value: int | None) -> None: ...

    @property
    def num_threads(self) -> int:
        """fetch and assembly threads (an online source's requests get their own)"""

    @num_threads.setter
    def num_threads(self, arg: int, /) -> None: ...

    @property
    def prefetch(self) -> int:
        """batch buffers"""

    @prefetch.setter
    def prefetch(self, arg: int, /) -> None: ...

    @property
    def read_ahead_bytes(self) -> int:
        """
        what the source may hold read ahead of the batch buffers, its files read into the page cache or an online source's samples fetched (0: 4 x the batch buffers' bytes, at least 256 MiB); metrics()['read_ahead_memory'] reports what it held
        """

    @read_ahead_bytes.setter
    def read_ahead_bytes(self, arg: int, /) -> None: ...

    @property
    def in_order(self) -> bool: ...

    @in_order.setter
    def in_order(self, arg: bool, /) -> None: ...

    @property
    def pin_memory(self) -> bool: ...

    @pin_memory.setter
    def pin_memory(self, arg: bool, /) -> None: ...

    @property
    def cuda_device(self) -> int:
        """the rank's CUDA device for every CUDA call (-1: LOCAL_RANK, else 0)"""

    @cuda_device.setter
    def cuda_device(self, arg: int, /) -> None: ...

    @property
    def device_stage(self) -> bool:
        """
        deliver batches in device memory of cuda_device, copied ahead on a stream of its own
        """

    @device_stage.setter
    def device_stage(self, arg: bool, /) -> None: ...

    @property
    def device_buffers(self) -> int:
        """batches in device memory at most (the device stage)"""

    @device_buffers.setter
    def device_buffers(self, arg: int, /) -> None: ...

    @property
    def chunk_bytes(self) -> int: ...

    @chunk_bytes.setter
    def chunk_bytes(self, arg: int, /) -> None: ...

    @property
    def fatal_failures_in_batch(self) -> bool: ...

    @fatal_failures_in_batch.setter
    def fatal_failures_in_batch(self, arg: bool, /) -> None: ...

    @property
    def source(self) -> None:
        """where hidden states come from (write-only; None: the cache)"""

    @source.setter
    def source(self, source: SampleSource | None) -> None: ...

    @property
    def hidden_states_path(self) -> str:
        """the cache folder; None or empty: <data_path>/hidden_states"""

    @hidden_states_path.setter
    def hidden_states_path(self, value: str | os.PathLike | None) -> None: ...

    @property
    def on_missing(self) -> str:
        """
        a row without a cached file: 'generate' (the online source), 'skip', 'warn' or 'raise'
        """

    @on_missing.setter
    def on_missing(self, arg: str, /) -> None: ...

    @property
    def lock_timeout(self) -> float:
        """seconds a writer's lock is waited for"""

    @lock_timeout.setter
    def lock_timeout(self, arg: float, /) -> None: ...

    @property
    def lock_poll(self) -> float:
        """seconds between two tries of a writer's lock"""

    @lock_poll.setter
    def lock_poll(self, arg: float, /) -> None: ...

    @property
    def fp8_dequantize_dtype(self) -> str:
        """
        FP8 files' dequantize dtype, as FP8Transfer's: 'bfloat16', 'float16' or 'float32' (or the torch dtype)
        """

    @fp8_dequantize_dtype.setter
    def fp8_dequantize_dtype(self, arg: object, /) -> None: ...

class Loader:
    """
    The epoch driver (C++ Loader): one split, planned per epoch, fetched and assembled by the pipeline.
    """

    def __init__(self, options: LoaderOptions) -> None: ...

    def plan(self, epoch: int, window_order: object = 'numpy') -> list:
        """
        this rank's batches of the epoch (arrays of split-local sample indices)
        """

    def set_epoch(self, epoch: int) -> None: ...

    @property
    def epoch(self) -> int: ...

    def begin_epoch(self, batches: object | None = None, fetch: bool = True) -> list[int]:
        """
        starts the epoch set by set_epoch over `batches` (arrays of split-local indices; None: the plan), less the batches a restored state delivered; the source learns what it will fetch; returns the positions to deliver. fetch=False: nothing is fetched (a sequence-parallel rank that is not a data rank: mark_delivered each)
        """

    def mark_delivered(self, position: int) -> None: ...

    def state(self) -> dict:
        """
        the resume state: {epoch, delivered, num_batches, seed, world_size, rank, total_seq_len, split, train_ratio (unless split is 'all'), dataset_rows, truncate}
        """

    def restore(self, state: dict, names: Mapping[str, str] = {}) -> None:
        """
        the next begin_epoch of state['epoch'] delivers exactly the other batches; ValueError naming both values when the state was saved by a loader of another plan (another split, dataset, ranks, total_seq_len, seed or truncate rule), the key as `names` spells it
        """

    def next(self, consumer_stream: int = 0) -> Batch | None:
        """
        the next batch, or None at the end of the epoch; consumer_stream: the CUDA stream (cudaStream_t as an int, 0: the default stream) the consumer copies or uses the batch on, where its reads are marked when the batch is released
        """

    def stop(self) -> None: ...

    def close(self) -> None:
        """stop, and the source forgets what it read ahead for this loader alone"""

    def set_device_memory(self, memory: DeviceMemory | None) -> None:
        """
        the device stage's buffers come from `memory` (None: cudaMalloc) from the next epoch on
        """

    def metrics(self) -> dict: ...

    @property
    def options(self) -> LoaderOptions: ...

    @property
    def pinning(self) -> str:
        """
        where batch buffers are: page-locked for which device through which CUDA runtime, or why they are pageable
        """

    @property
    def cuda_device(self) -> int:
        """the CUDA device the buffers are pinned on or copied to; -1: none"""

    @property
    def split_begin(self) -> int: ...

    @property
    def split_end(self) -> int: ...

    @property
    def batch_bytes(self) -> int: ...

    @property
    def pool_bytes(self) -> int: ...

    @property
    def num_rows(self) -> int: ...

    @property
    def lengths(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,))]:
        """the split's sample lengths (the planner's), a copy"""

    @property
    def columns(self) -> list: ...

class DeviceMemory:
    """
    Device memory blocks made by the caller (torch.empty on the device) that the device stage takes its buffers from instead of cudaMalloc; the caller keeps them alive while `outstanding` is not 0. A request no free block fits goes to cudaMalloc (fallback_bytes).
    """

    def __init__(self, blocks: Sequence[tuple[int, int]]) -> None:
        """blocks: [(address, bytes)] of device memory on the loader's device"""

    @property
    def outstanding(self) -> int:
        """blocks handed out to the engine now (device reads may be pending)"""

    @property
    def given_bytes(self) -> int: ...

    @property
    def fallback_bytes(self) -> int:
        """bytes the engine took from cudaMalloc because no block was free"""

    @property
    def fallback_outstanding(self) -> int: ...

def fence_counts() -> dict:
    """
    process-wide: buffers about to be rewritten while the device's reads of them were still pending (the fence made the writer wait, or ordered the copy after them), and checks before a reuse or a free that found reads pending
    """

def pinning_support() -> tuple[bool, str]: ...

def python_transfer_source(transfer: object, on_missing: str = 'skip') -> SampleSource:
    """
    A SampleSource calling transfer.get_cached(file_idx) (hs-connectors interface) per sample.
    """

class MooncakeTransfer:
    """
    hs-connectors' Mooncake transfer read natively: batch_get_into rounds into registered memory (source/mooncake_transfer.h). Pass it as OnlineSource(..., transfer=...).
    """

    def __init__(self, *, local_hostname: str, metadata_server: str, global_segment_size: int, local_buffer_size: int, protocol: str, device_name: str, master_server_address: str, key_wait: float = 120.0, poll_interval: float = 0.05, staging_chunk_bytes: int = 67108864) -> None:
        """
        the store settings of hs-connectors' MooncakeStoreConfig; key_wait and poll_interval as its get_sample's timeout and poll_interval
        """

    def stats(self) -> dict: ...

    @property
    def description(self) -> str: ...

class OnlineSourceOptions:
    """
    Options of the online source (C++ OnlineSourceOptions and its client's), under draftfeed.online.OnlineSource's names; OnlineSourceOptions(name=value, ...) sets them by name, the others keep C++'s defaults. validate() checks them.
    """

    def __init__(self, **kwargs) -> None: ...

    def validate(self) -> None:
        """raises ValueError naming the first bad field"""

    @property
    def vllm_endpoint(self) -> list[str]:
        """the servers' URLs (.../v1): one or several"""

    @vllm_endpoint.setter
    def vllm_endpoint(self, arg: object, /) -> None: ...

    @property
    def on_generate(self) -> str:
        """
        delete (the reference's) | cache: move a generated file into the cache | pack: keep it, compressed, in the cache folder's pack within cache_budget_bytes
        """

    @on_generate.setter
    def on_generate(self, arg: str, /) -> None: ...

    @property
    def cache_budget_bytes(self) -> int:
        """
        on_generate='pack': the pack's bytes on disk at most: an int, a size such as '500GB', or None (0: no bound)
        """

    @cache_budget_bytes.setter
    def cache_budget_bytes(self, value: object | None) -> None: ...

    @property
    def cache_shard_bytes(self) -> int:
        """
        on_generate='pack': bytes of a shard (held in memory while it is assembled)
        """

    @cache_shard_bytes.setter
    def cache_shard_bytes(self, arg: int, /) -> None: ...

    @property
    def cache_compress(self) -> bool:
        """on_generate='pack': hidden states coded losslessly (planes-zstd)"""

    @cache_compress.setter
    def cache_compress(self, arg: bool, /) -> None: ...

    @property
    def cache_lock_wait(self) -> float:
        """
        on_generate='pack': seconds a shard's commit waits for the folder's writer lock before the shard is dropped (training never waits longer)
        """

    @cache_lock_wait.setter
    def cache_lock_wait(self, arg: float, /) -> None: ...

    @property
    def verifier_name_or_path(self) -> str:
        """the model the servers must serve (None or empty: any)"""

    @verifier_name_or_path.setter
    def verifier_name_or_path(self, value: str | None) -> None: ...

    @property
    def request_timeout(self) -> float:
        """seconds per attempt; None or 0: no limit"""

    @request_timeout.setter
    def request_timeout(self, value: float | None) -> None: ...

    @property
    def max_retries(self) -> int:
        """extra attempts after transport errors, timeouts and HTTP 5xx"""

    @max_retries.setter
    def max_retries(self, arg: int, /) -> None: ...

    @property
    def retry_backoff(self) -> float:
        """seconds before the first retry, doubling"""

    @retry_backoff.setter
    def retry_backoff(self, arg: float, /) -> None: ...

    @property
    def generation_validation_retries(self) -> int:
        """extra generate-load-validate round trips after a bad file"""

    @generation_validation_retries.setter
    def generation_validation_retries(self, arg: int, /) -> None: ...

    @property
    def max_consecutive_generation_failures(self) -> int:
        """rows failing in a row before the run stops"""

    @max_consecutive_generation_failures.setter
    def max_consecutive_generation_failures(self, arg: int, /) -> None: ...

    @property
    def fail_on_hidden_state_error(self) -> bool:
        """stop the run at the first row that fails"""

    @fail_on_hidden_state_error.setter
    def fail_on_hidden_state_error(self, arg: bool, /) -> None: ...

    @property
    def fetch_threads(self) -> int:
        """requests in flight at most (the engine runs one thread per request)"""

    @fetch_threads.setter
    def fetch_threads(self, arg: int, /) -> None: ...

    @property
    def vllm_http_keepalive(self) -> bool:
        """reuse connections"""

    @vllm_http_keepalive.setter
    def vllm_http_keepalive(self, arg: bool, /) -> None: ...

    @property
    def server_dir(self) -> str:
        """
        the folder the servers write into: handles elsewhere are refused (None: anywhere)
        """

    @server_dir.setter
    def server_dir(self, value: str | os.PathLike | None) -> None: ...

    @property
    def generated_file_clock_skew(self) -> float:
        """
        seconds a generated file may look older than its request and still be its output (clock skew between this host and a shared file system's server); an older file is never removed or moved
        """

    @generated_file_clock_skew.setter
    def generated_file_clock_skew(self, arg: float, /) -> None: ...

    @property
    def api_key(self) -> bool:
        """
        the key of servers started with --api-key, sent as 'Authorization: Bearer ...' (None: $OPENAI_API_KEY, as the OpenAI client reads it); reads back only whether one is set
        """

    @api_key.setter
    def api_key(self, value: str | None) -> None: ...

    @property
    def max_response_bytes(self) -> int: ...

    @max_response_bytes.setter
    def max_response_bytes(self, arg: int, /) -> None: ...

    @property
    def max_file_bytes(self) -> int: ...

    @max_file_bytes.setter
    def max_file_bytes(self, arg: int, /) -> None: ...

    @property
    def max_abandoned_files(self) -> int:
        """
        failed generated files still locked by their writer kept open for a later sweep, at most (the oldest past it is left in place)
        """

    @max_abandoned_files.setter
    def max_abandoned_files(self, arg: int, /) -> None: ...

    @property
    def rest_after_failures(self) -> int:
        """failures in a row that rest a server"""

    @rest_after_failures.setter
    def rest_after_failures(self, arg: int, /) -> None: ...

    @property
    def rest_time(self) -> float:
        """seconds a failing server is rested"""

    @rest_time.setter
    def rest_time(self, arg: float, /) -> None: ...

    @property
    def log_failures(self) -> bool: ...

    @log_failures.setter
    def log_failures(self, arg: bool, /) -> None: ...

    @property
    def hidden_states_path(self) -> str:
        """the cache folder; None or empty: <data_path>/hidden_states"""

    @hidden_states_path.setter
    def hidden_states_path(self, value: str | os.PathLike | None) -> None: ...

    @property
    def on_missing(self) -> str:
        """
        a row without a cached file: 'generate' (the online source), 'skip', 'warn' or 'raise'
        """

    @on_missing.setter
    def on_missing(self, arg: str, /) -> None: ...

    @property
    def lock_timeout(self) -> float:
        """seconds a writer's lock is waited for"""

    @lock_timeout.setter
    def lock_timeout(self, arg: float, /) -> None: ...

    @property
    def lock_poll(self) -> float:
        """seconds between two tries of a writer's lock"""

    @lock_poll.setter
    def lock_poll(self, arg: float, /) -> None: ...

    @property
    def fp8_dequantize_dtype(self) -> str:
        """
        FP8 files' dequantize dtype, as FP8Transfer's: 'bfloat16', 'float16' or 'float32' (or the torch dtype)
        """

    @fp8_dequantize_dtype.setter
    def fp8_dequantize_dtype(self, arg: object, /) -> None: ...

class LookaheadOptions:
    """
    Options of an online source's lookahead (C++ LookaheadOptions), under draftfeed.online.OnlineSource's names; LookaheadOptions(name=value, ...) sets them by name, the others keep C++'s defaults.
    """

    def __init__(self, **kwargs) -> None: ...

    def validate(self) -> None:
        """raises ValueError naming the first bad field"""

    @property
    def lookahead(self) -> int | None:
        """
        rows fetched ahead at most (None: 8 x fetch_threads with data_path, else 0; 0: off)
        """

    @lookahead.setter
    def lookahead(self, value: int | None) -> None: ...

    @property
    def hedge_factor(self) -> float:
        """
        ask again for a row whose request ran that many times its predicted time (0: never)
        """

    @hedge_factor.setter
    def hedge_factor(self, arg: float, /) -> None: ...

    @property
    def hedge_min_seconds(self) -> float:
        """and at least that long"""

    @hedge_min_seconds.setter
    def hedge_min_seconds(self, arg: float, /) -> None: ...

    @property
    def lookahead_next_epoch(self) -> bool:
        """
        the Loader hands the lookahead the next epoch's batches too (training only), so its first requests run while this epoch's last ones are slow; they are requests beyond the epoch (wasted after the last one)
        """

    @lookahead_next_epoch.setter
    def lookahead_next_epoch(self, arg: bool, /) -> None: ...

class VllmClient:
    """
    The vLLM hidden-state client alone: /models check, completions or chat request, response checks, retries, endpoints.
    """

    def __init__(self, options: OnlineSourceOptions) -> None:
        """the client of an online source with these options"""

    def generate(self, input_ids: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> dict: ...

    def generate_chat(self, messages_json: str, input_ids: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> dict: ...

    def stats(self) -> dict: ...

    def cancel(self) -> None: ...

class OnlineSource(SampleSource):
    """
    Hidden states from the cache, else generated by vLLM servers on demand (docs/protocol.md). A SampleSource: pass it as Loader(..., source=...). Build it with draftfeed.online.OnlineSource(...).
    """

    def __init__(self, options: OnlineSourceOptions, data_path: str | os.PathLike | None = None, lookahead: LookaheadOptions = ..., transfer: object | None = None) -> None:
        """
        options: OnlineSourceOptions; data_path: the dataset (multimodal rows' messages, the lookahead, the cache folder's default <data_path>/hidden_states); lookahead: LookaheadOptions (its window's default needs data_path)
        """

    def stats(self) -> dict: ...

    def plan_rows(self, rows: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None:
        """
        the global rows coming next, in order (each its own batch): fetched ahead by the lookahead threads
        """

    def take_messages(self) -> tuple:
        """
        (warnings logged since the last call, how many more were dropped unread): failed round trips, exhausted rows, recoveries, files left in place
        """

    @property
    def log_failures(self) -> bool: ...

    @property
    def lookahead(self) -> bool: ...

    @property
    def lookahead_options(self) -> LookaheadOptions:
        """the lookahead's options, its window resolved (0: off)"""

    @property
    def reads_messages(self) -> bool:
        """
        whether multimodal rows can be sent as chat requests (the source knows the dataset)
        """

    def cancel(self) -> None:
        """end transfers and backoff sleeps now; later fetches fail fast"""

    def flush_kept(self) -> None:
        """
        on_generate='pack': commit the rows generated so far to the pack, and wait for it (each epoch's start does it too)
        """

    @property
    def options(self) -> OnlineSourceOptions:
        """the options it was built with (a copy)"""

    def fetch(self, row: int, input_ids: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> dict:
        """
        one row through the source: {ok, reason, message, fatal, hidden_states (float32 copy)}
        """

def permutation(seed: object, x: object) -> Annotated[NDArray[numpy.int64], dict(shape=(None,))]:
    """
    numpy.random.default_rng(seed).permutation(x), bit for bit, as an int64 array.

    `x` is a size n (a permutation of arange(n)) or a 1-d integer array (a shuffled copy).
    `seed` is any non-negative integer, as numpy accepts it.
    """

def _numpy_interval_draws(seed: object, maxima: Sequence[int]) -> Annotated[NDArray[numpy.int64], dict(shape=(None,))]:
    """
    Test support: numpy's random_interval(max) for each max in turn, from default_rng(seed)'s PCG64 (int64 array; draws above 2^63 wrap).
    """

def plan_batches(lengths: object, max_len: int, world_size: int, rank: int, *, epoch: int = 0, seed: object = 0, truncate: bool = True, max_batches: int | None = None, window_order: object = 'numpy') -> list:
    """
    This rank's batches for the epoch, as speculators' MultipackDistributedBatchSamplerV2
    plans them: a list of int64 arrays of positions in `lengths`, in packing order.
    `truncate=False` drops samples longer than max_len instead of clipping their length.
    `window_order`: how samples of equal length are ordered in each batch: 'numpy' (the
    reference's numpy.argsort, called once per batch that has ties), 'native' (ours, no
    Python calls; tied samples may land on other ranks than the reference's), or a
    callable with numpy.argsort's contract.
    """

def plan_all_ranks(lengths: object, max_len: int, world_size: int, *, epoch: int = 0, seed: object = 0, truncate: bool = True, max_batches: int | None = None, with_counts: bool = False, window_order: object = 'numpy') -> object:
    """
    Every rank's batches for the epoch in one pass: a list (index = rank) of lists of int64
    arrays. With `with_counts=True`, returns (batches, counts) where counts is a dict with
    num_samples, num_long, dropped_long, dropped_tail, cut_by_max_batches and planned.
    `window_order` as in plan_batches.
    """

def pack_samples(samples: list, max_len: int, hidden_states_dtype: str = 'bfloat16', pin_memory: bool = False, consumer_stream: int = 0, cuda_device: int = -1) -> dict:
    """
    Packs the dicts a preprocess callable returned into one batch, as speculators' collate does: every key but `lengths` as [1, max_len, ...] (hidden-state keys in hidden_states_dtype, others in the first sample's dtype), rows back to back and truncated at max_len, then document_ids. Returns a dict of torch tensors. With pin_memory, the batch is page-locked on cuda_device (-1: LOCAL_RANK, else 0) and freed only after the copies queued from it on consumer_stream have run.
    """

def fp8_to_float(codes: Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> NDArray[numpy.float32]:
    """float8_e4m3fn codes -> their float32 values"""

def float_to_fp8(values: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> NDArray[numpy.uint8]:
    """
    float32 values -> float8_e4m3fn codes (round to nearest even, NaN past 464)
    """

def fp8_copy_rows(codes: Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu', writable=False)], scales: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], dequantize: str = 'bfloat16', out_dtype: str = 'bfloat16', noise: str = 'none', noise_std: float = 0.0, noise_key: int = 0) -> object:
    """
    The batch copy over FP8 rows (one scale per row): (values, non-finite count); bf16 values as uint16 bits.
    """

def quantize_fp8(values: bytes, dtype: str, tokens: int, per_token: int) -> tuple[NDArray[numpy.uint8], NDArray[numpy.float32]]:
    """
    hs-connectors' per-token FP8 quantization of raw values: (codes, scales)
    """

def write_fp8_sample(source: str, target: str) -> int:
    """
    Writes the FP8 file (hs-connectors' layout) of a bf16/f16/f32 hidden-state file; returns its size.
    """

def fp8_dequantize(codes: Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu', writable=False)], scales: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], dequantize: str = 'bfloat16') -> tuple:
    """
    FP8Transfer's dequantize of a whole tensor: (raw bytes in that dtype, its torch name)
    """
