"""Plots of a study: optimization history and parameter importances, as PNG files."""
from __future__ import annotations

from pathlib import Path

import optuna


def save_plots(study: optuna.Study, folder: str | Path) -> list[Path]:
    """Write history.png and (with enough trials) importances.png into `folder`; return the paths."""
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        return written
    ax = ovm.plot_optimization_history(study)
    ax.set_ylabel("kernel time (s)")
    ax.set_yscale("log")
    written.append(_save(ax.figure, folder / "history.png"))
    plt.close(ax.figure)
    if len(complete) >= 4:
        ax = ovm.plot_param_importances(study)
        written.append(_save(ax.figure, folder / "importances.png"))
        plt.close(ax.figure)
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
