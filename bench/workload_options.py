"""The workload flags `toolkit bench` and `toolkit tune` share, each declared once (name, type, default, help,
panel), spliced into a command's signature by `workload_flags` and parsed into one `BenchOptions`.

Light on purpose: `toolkit --help` imports this, so the load generator is imported only when a command runs.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from toolkit.bench.command import BenchOptions

TARGET, LOAD, DATASET, OUTPUT = "Target", "Load", "Dataset", "Output"
NO_SERVER_YET = "http://127.0.0.1:0"  # the workload's base URL until the command knows its server


@dataclass(frozen=True, slots=True)
class Flag:
    """One shared flag. `name` is the parameter, and the `BenchOptions` field it sets unless `dataset_field` names
    the `DatasetSpec` field it sets instead."""

    name: str
    type: Any
    default: Any
    help: str
    panel: str
    aliases: tuple[str, ...] = ()  # every spelling when given, e.g. ("--rate", "--request-rate")
    min: int | None = None
    envvar: str | None = None
    dataset_field: str | None = None

    def parameter(self, panel: str | None) -> inspect.Parameter:
        option = typer.Option(self.default, *self.aliases, help=self.help, rich_help_panel=panel or self.panel,
                              min=self.min, envvar=self.envvar)
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=self.type)


FLAGS: tuple[Flag, ...] = (
    Flag("backend", str, "sglang", "sglang (/generate) | openai (/v1/completions) | openai-chat "
         "(/v1/chat/completions); SGLang's names sglang-oai, sglang-oai-chat, vllm, vllm-chat also work.", TARGET),
    Flag("api_key", str, None, "Bearer key for the server.", TARGET, envvar="OPENAI_API_KEY"),
    Flag("model", str, None, "Model name to request (default: the first of GET /v1/models).", TARGET),
    Flag("tokenizer", str, None, "Tokenizer folder or .gguf (default: the embedded SmolLM2's).", TARGET),
    Flag("extra_request_body", str, None, "JSON object merged into every request body, e.g. "
         "'{\"stop\": [\".\"]}'.", TARGET),
    Flag("json_schema", Path, None, "A JSON schema file: every request's output is constrained to it (SGLang's "
         "sampling_params.json_schema; response_format json_schema, strict, on the OpenAI dialects). A custom "
         "dataset row's own json_schema wins.", TARGET),
    Flag("rate", str, None, "Requests/s: 8, inf (all at once) or a list 1,2,4,8 (bench only); default: inf, or the "
         "trace's own timestamps for --dataset trace. A max-rate search starts from it.", LOAD,
         aliases=("--rate", "--request-rate")),
    Flag("arrival", str, "poisson", "poisson | constant | gamma.", LOAD),
    Flag("burstiness", float, 1.0, "Gamma shape for --arrival gamma (1 = Poisson; <1 burstier).", LOAD),
    Flag("num_prompts", int, None, "Requests per run (default: 1000, or the dataset's size).", LOAD, min=1),
    Flag("duration", float, None, "Seconds of arrivals per run, instead of --num-prompts.", LOAD),
    Flag("slo_attainment", float, 0.9, "Max-rate search: the fraction of requests that must meet every --slo bound "
         "for a run to pass.", LOAD),
    Flag("search_runs", int, 8, "Max-rate search: most runs, the saturation run included.", LOAD),
    Flag("max_concurrency", int, None, "Most requests in flight at once.", LOAD, min=1),
    Flag("warmup_requests", int, 1, "Requests sent before each measured run.", LOAD, min=0),
    Flag("seed", int, 1, "Seed for arrivals and synthetic prompts.", LOAD, dataset_field="seed"),
    Flag("request_timeout", float, 600.0, "Seconds before a request counts as timed out.", LOAD),
    Flag("ignore_eos", bool, None, "Force the full output length (default: on for random, generated-shared-prefix "
         "and trace).", LOAD, aliases=("--ignore-eos/--no-ignore-eos",)),
    Flag("dataset", str, "random", "random | generated-shared-prefix | sharegpt | custom | trace.", DATASET,
         aliases=("--dataset", "--dataset-name"), dataset_field="name"),
    Flag("dataset_path", Path, None, "File for sharegpt (JSON), custom (JSONL) or trace (Azure CSV or Mooncake "
         "JSONL); trace default: Azure 2023 conversations.", DATASET, dataset_field="path"),
    Flag("random_input_len", int, 1024, "Input tokens, at most (random).", DATASET, dataset_field="random_input_len"),
    Flag("random_output_len", int, 1024, "Output tokens, at most (random).", DATASET,
         dataset_field="random_output_len"),
    Flag("random_range_ratio", float, 0.0, "Lengths are uniform on \\[ratio·L, L] (random).", DATASET,
         dataset_field="random_range_ratio"),
    Flag("gsp_num_groups", int, 64, "Shared-prefix groups.", DATASET, min=1, dataset_field="gsp_num_groups"),
    Flag("gsp_prompts_per_group", int, 16, "Prompts per group.", DATASET, min=1,
         dataset_field="gsp_prompts_per_group"),
    Flag("gsp_system_prompt_len", int, 2048, "Shared system prompt tokens.", DATASET, min=0,
         dataset_field="gsp_system_prompt_len"),
    Flag("gsp_question_len", int, 128, "Per-prompt question tokens.", DATASET, min=1,
         dataset_field="gsp_question_len"),
    Flag("gsp_output_len", int, 256, "Output tokens per prompt.", DATASET, min=1, dataset_field="gsp_output_len"),
    Flag("sharegpt_output_len", int, None, "Override output lengths of sharegpt/custom rows.", DATASET, min=1,
         dataset_field="sharegpt_output_len"),
    Flag("trace_time_scale", float, 1.0, "Multiply trace inter-arrival times (0.5 = twice as fast).", DATASET,
         dataset_field="trace_time_scale"),
    Flag("slo", list[str], [], "SLOs in ms for goodput and the max-rate search, e.g. --slo "
         "'ttft:200 tpot:50 e2e:3000'.", OUTPUT),
)
Differences = Mapping[str, Mapping[str, Any]]  # flag name -> the `Flag` fields a command declares otherwise


def command_flags(differences: Differences) -> tuple[Flag, ...]:
    """The shared flags as one command shows them."""
    unknown = set(differences) - {flag.name for flag in FLAGS}
    if unknown:
        raise ValueError(f"no shared workload flag named {', '.join(sorted(unknown))}")
    return tuple(replace(flag, **differences.get(flag.name, {})) for flag in FLAGS)


def bench_options(values: Mapping[str, Any]) -> BenchOptions:
    """The parsed shared flags as one `BenchOptions` (every other field at its default)."""
    from toolkit.bench.command import BenchOptions
    from toolkit.bench.datasets.base import DatasetSpec

    spec = DatasetSpec(**{flag.dataset_field: values[flag.name] for flag in FLAGS if flag.dataset_field})
    fields = {flag.name: values[flag.name] for flag in FLAGS if not flag.dataset_field}
    return BenchOptions(base_url=NO_SERVER_YET, dataset=spec, **{**fields, "slo": tuple(fields["slo"])})


def workload_flags(panel: str | None = None,
                   differences: Differences | None = None) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Replaces the command's keyword-only `workload` parameter by the shared flags (all in `panel` when given, else
    in their own panels), and calls the command with them parsed into `workload`, a `BenchOptions`."""
    flags = command_flags(differences or {})

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command)
        params = list(signature.parameters.values())
        at = [param.name for param in params].index("workload")
        params[at:at + 1] = [flag.parameter(panel) for flag in flags]

        @functools.wraps(command)
        def parsed(**values: Any) -> None:
            workload = bench_options({flag.name: values.pop(flag.name) for flag in flags})
            command(workload=workload, **values)

        # NOTE: typer reads the signature and the type hints; `workload`'s hint is left out, so it is never evaluated
        # and `BenchOptions` (the load generator) is imported only when the command runs
        parsed.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        own = {name: hint for name, hint in command.__annotations__.items() if name != "workload"}
        parsed.__annotations__ = {**own, **{flag.name: flag.type for flag in flags}}
        return parsed

    return decorate
