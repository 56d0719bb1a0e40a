"""Result types: stored draws, the phase decomposition and :class:`BIFResult` (save/load)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxtyping import Float, Int
from torch import Tensor

from interp_toolkit.errors import UserError
from interp_toolkit.io import is_artifact, load_artifact, save_artifact

from .diagnostics import ConvergenceDiagnostics
from .locality import Locality, sampling_verdict
from .sampler import SamplerDiagnostics

RESULT_FILE = "bif.safetensors"

# --------------------------------------------------------------------------- results


@dataclass
class Draws:
    """Stored draws: what :func:`compute_bif` needs.

    Attributes:
        attribution: Recorded attribution values (per-example training losses) per draw.
        observables: Recorded observable values per draw (concatenated).
        observable_slices: ``name -> (start, stop)`` columns of each observable.
        statistic: Optional scalar per draw (e.g. for :func:`cluster_phases`); by default
            the mean attribution loss at the draw.
        phase_labels: Phase label per draw if a ``phase_fn`` was used while sampling
            (``compute_bif(draws, phases=draws.phase_labels)`` reproduces the split).
    """

    attribution: Float[Tensor, "chains draws n_train"]
    observables: Float[Tensor, "chains draws n_query"]
    observable_slices: dict[str, tuple[int, int]] = field(default_factory=dict)
    statistic: Float[Tensor, "chains draws"] | None = None
    phase_labels: Int[Tensor, "chains draws"] | None = None

    def __post_init__(self) -> None:
        if self.attribution.ndim != 3 or self.observables.ndim != 3:
            raise UserError(
                "Draws.attribution and Draws.observables must be [chains, draws, values], got shapes "
                f"{tuple(self.attribution.shape)} and {tuple(self.observables.shape)}"
            )
        if self.attribution.shape[:2] != self.observables.shape[:2]:
            raise UserError(
                f"Draws: attribution has {tuple(self.attribution.shape[:2])} (chains, draws) but "
                f"observables has {tuple(self.observables.shape[:2])}"
            )
        if not self.observable_slices:
            self.observable_slices = {"observable": (0, int(self.observables.shape[2]))}
        if self.statistic is None:
            self.statistic = self.attribution.double().mean(-1)


@dataclass
class PhaseDecomposition:
    """Split of ``-Cov`` into within-phase and between-phase parts (exact: they add up).

    With phase weights ``pi_k`` (fraction of draws), phase means ``mu_k`` / ``nu_k`` and
    phase covariances ``Cov_k``:

    * ``within = -sum_k pi_k Cov_k``
    * ``between = -sum_k pi_k (mu_k - mu)(nu_k - nu)^T``
    * ``within + between == total == -Cov`` (population covariances over all draws).

    Attributes:
        labels: Phase labels, in the order of the other tensors' first axis.
        weights: ``pi_k``.
        within, between, total: ``n_train x n_query`` matrices (always covariance units).
        per_phase: ``-Cov_k`` for each phase.
        within_stderr, between_stderr: Standard errors across chains (NaN for one chain).
    """

    labels: list[int]
    weights: Float[Tensor, " k"]
    within: Float[Tensor, "n_train n_query"]
    between: Float[Tensor, "n_train n_query"]
    total: Float[Tensor, "n_train n_query"]
    per_phase: Float[Tensor, "k n_train n_query"]
    within_stderr: Float[Tensor, "n_train n_query"]
    between_stderr: Float[Tensor, "n_train n_query"]


@dataclass
class BIFResult:
    """Bayesian influence matrix with its uncertainty.

    Attributes:
        bif: ``-Cov(loss_i, phi_j)`` (or ``-Corr`` if ``pearson``), ``n_train x n_query``.
        stderr: Standard error per entry: the leave-one-chain-out jackknife of the pooled
            estimate (NaN for 1 chain). It includes the between-chain part of the pooled
            covariance (chains that sit at different places).
        per_chain: The estimate from each chain alone.
        per_chain_stderr: Std of the per-chain estimates / sqrt(chains) (NaN for 1 chain):
            the spread of the chains' own estimates, blind to the between-chain part.
        pearson: Whether ``bif`` is correlation-normalized.
        chains, draws_per_chain: Draw counts.
        attribution_mean, observable_mean: Posterior means of the recorded values.
        observable_slices: ``name -> (start, stop)`` columns of each observable.
        phases: Within/between decomposition, if phases were given.
        diagnostics: Sampler health (``None`` for :func:`compute_bif`).
        convergence: Split R-hat, bulk/tail ESS and between-chain share of the tracked
            entries, and the ``converged`` flag (:mod:`.diagnostics`).
        draws: The raw draws if kept.
        config: The sampler config as a dict (``None`` for :func:`compute_bif`).
        cache_key: Config hash under which it was cached.
        locality: Whether the draws still describe the checkpoint's solution
            (:mod:`.locality`; ``None`` for :func:`compute_bif` and results of earlier versions).
        group_means: ``group -> observable -> (bif, stderr)``: each row group's mean BIF on each
            observable's mean with its jackknife error (``bif(..., row_groups=...)``).
    """

    bif: Float[Tensor, "n_train n_query"]
    stderr: Float[Tensor, "n_train n_query"]
    per_chain: Float[Tensor, "chains n_train n_query"]
    pearson: bool
    chains: int
    draws_per_chain: int
    attribution_mean: Float[Tensor, " n_train"]
    observable_mean: Float[Tensor, " n_query"]
    observable_slices: dict[str, tuple[int, int]]
    phases: PhaseDecomposition | None = None
    diagnostics: SamplerDiagnostics | None = None
    draws: Draws | None = None
    config: dict[str, Any] | None = None
    cache_key: str | None = None
    per_chain_stderr: Float[Tensor, "n_train n_query"] | None = None
    convergence: ConvergenceDiagnostics | None = None
    locality: Locality | None = None
    group_means: dict[str, dict[str, tuple[float, float]]] | None = None

    @property
    def verdict(self) -> str:
        """``converged and local``, ``converged, not local`` or ``not converged``
        (:func:`~.locality.sampling_verdict`)."""
        return sampling_verdict(self.convergence is not None and self.convergence.converged, self.locality)

    def observable(self, name: str) -> Float[Tensor, "n_train k"]:
        """Columns of ``bif`` belonging to observable ``name``."""
        if name not in self.observable_slices:
            raise KeyError(f"no observable {name!r}; have {sorted(self.observable_slices)}")
        start, stop = self.observable_slices[name]
        return self.bif[:, start:stop]

    def save(self, directory: str | Path) -> Path:
        """Write the result as one artifact, ``directory/bif.safetensors`` (tensors, metadata and
        per-tensor digests; see :func:`interp_toolkit.io.save_artifact`). Returns ``directory``."""
        directory = Path(directory)
        tensors: dict[str, Tensor] = {
            "bif": self.bif,
            "stderr": self.stderr,
            "per_chain": self.per_chain,
            "attribution_mean": self.attribution_mean,
            "observable_mean": self.observable_mean,
        }
        if self.per_chain_stderr is not None:
            tensors["per_chain_stderr"] = self.per_chain_stderr
        if self.convergence is not None:
            tensors.update(self.convergence.tensors())
        if self.phases is not None:
            for name in ("weights", "within", "between", "total", "per_phase", "within_stderr", "between_stderr"):
                tensors[f"phases.{name}"] = getattr(self.phases, name)
        if self.diagnostics is not None:
            tensors.update(diagnostics_tensors(self.diagnostics))
        if self.draws is not None:
            tensors["draws.attribution"] = self.draws.attribution
            tensors["draws.observables"] = self.draws.observables
            assert self.draws.statistic is not None  # Draws.__post_init__ fills the default
            tensors["draws.statistic"] = self.draws.statistic
            if self.draws.phase_labels is not None:
                tensors["draws.phase_labels"] = self.draws.phase_labels
        meta = {
            "pearson": self.pearson,
            "chains": self.chains,
            "draws_per_chain": self.draws_per_chain,
            "observable_slices": {k: list(v) for k, v in self.observable_slices.items()},
            "phase_labels": self.phases.labels if self.phases is not None else None,
            "config": self.config,
            "cache_key": self.cache_key,
            "diagnostics": None if self.diagnostics is None else diagnostics_metadata(self.diagnostics),
            "convergence": None if self.convergence is None else self.convergence.metadata(),
            "stderr_method": "jackknife",
            "locality": None if self.locality is None else self.locality.to_dict(),
            "group_means": None if self.group_means is None else {
                g: {k: list(v) for k, v in by.items()} for g, by in self.group_means.items()},
        }
        save_artifact(directory / RESULT_FILE, tensors, meta, kind="bif_result")
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "BIFResult":
        """Read a result written by :meth:`save` (every tensor checked against its digest)."""
        directory = Path(directory)
        t, meta = load_artifact(directory / RESULT_FILE, kind="bif_result")
        phases = None
        if meta["phase_labels"] is not None:
            phases = PhaseDecomposition(
                labels=list(meta["phase_labels"]),
                **{
                    n: t[f"phases.{n}"]
                    for n in ("weights", "within", "between", "total", "per_phase", "within_stderr", "between_stderr")
                },
            )
        diagnostics = None
        if meta["diagnostics"] is not None:
            diagnostics = diagnostics_from(t, meta["diagnostics"])
        slices = {k: (int(v[0]), int(v[1])) for k, v in meta["observable_slices"].items()}
        draws = None
        if "draws.attribution" in t:
            draws = Draws(t["draws.attribution"], t["draws.observables"], slices, t["draws.statistic"],
                          t.get("draws.phase_labels"))
        return cls(
            bif=t["bif"],
            stderr=t["stderr"],
            per_chain=t["per_chain"],
            pearson=meta["pearson"],
            chains=meta["chains"],
            draws_per_chain=meta["draws_per_chain"],
            attribution_mean=t["attribution_mean"],
            observable_mean=t["observable_mean"],
            observable_slices=slices,
            phases=phases,
            diagnostics=diagnostics,
            draws=draws,
            config=meta["config"],
            cache_key=meta["cache_key"],
            per_chain_stderr=t.get("per_chain_stderr"),
            convergence=None if meta.get("convergence") is None else ConvergenceDiagnostics.from_artifact(
                t, meta["convergence"]),
            locality=None if meta.get("locality") is None else Locality.from_dict(meta["locality"]),
            group_means=None if meta.get("group_means") is None else {
                g: {k: (float(v[0]), float(v[1])) for k, v in by.items()} for g, by in meta["group_means"].items()},
        )

    @staticmethod
    def is_stored(directory: str | Path) -> bool:
        """Whether ``directory`` holds a saved result (a cache hit; a file of an earlier format,
        e.g. one whose ``stderr`` was the per-chain spread, is not)."""
        path = Path(directory) / RESULT_FILE
        return is_artifact(path, kind="bif_result") and load_artifact(path, kind="bif_result")[1].get(
            "stderr_method") == "jackknife"


def diagnostics_tensors(diagnostics: SamplerDiagnostics) -> dict[str, Tensor]:
    """The tensors of :class:`SamplerDiagnostics`, for an artifact (``diagnostics.*``)."""
    out = {"diagnostics.loss_trace": diagnostics.loss_trace,
           "diagnostics.burn_in_drift": diagnostics.burn_in_drift,
           "diagnostics.sampling_drift": diagnostics.sampling_drift}
    for name in ("distance_trace", "draw_loss", "draw_distance", "draw_accuracy"):
        if getattr(diagnostics, name) is not None:
            out[f"diagnostics.{name}"] = getattr(diagnostics, name)
    return out


def diagnostics_metadata(diagnostics: SamplerDiagnostics) -> dict[str, Any]:
    """The JSON part of :class:`SamplerDiagnostics`."""
    return {"initial_loss": diagnostics.initial_loss, "n_beta": diagnostics.n_beta,
            "sampled_parameters": diagnostics.sampled_parameters, "warnings": diagnostics.warnings,
            "initial_accuracy": diagnostics.initial_accuracy, "n_parameters": diagnostics.n_parameters}


def diagnostics_from(tensors: dict[str, Tensor], meta: dict[str, Any]) -> SamplerDiagnostics:
    """Rebuild :class:`SamplerDiagnostics` from :func:`diagnostics_tensors` + :func:`diagnostics_metadata`."""
    return SamplerDiagnostics(
        loss_trace=tensors["diagnostics.loss_trace"],
        initial_loss=meta["initial_loss"],
        n_beta=meta["n_beta"],
        burn_in_drift=tensors["diagnostics.burn_in_drift"],
        sampling_drift=tensors["diagnostics.sampling_drift"],
        sampled_parameters=list(meta["sampled_parameters"]),
        warnings=list(meta["warnings"]),
        distance_trace=tensors.get("diagnostics.distance_trace"),
        draw_loss=tensors.get("diagnostics.draw_loss"),
        draw_distance=tensors.get("diagnostics.draw_distance"),
        draw_accuracy=tensors.get("diagnostics.draw_accuracy"),
        initial_accuracy=meta.get("initial_accuracy"),
        n_parameters=meta.get("n_parameters"),
    )
