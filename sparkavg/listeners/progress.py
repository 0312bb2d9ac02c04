"""A progress bar of epochs and rounds on the driver (tqdm), when the output is a terminal.

:class:`ProgressBar` draws two bars: the fit's epochs (loss, validation
loss, accuracy and metrics, ETA) and the running epoch's rounds (running loss, examples/s,
ETA).  While they are drawn, log lines of the console handlers go above
them (``tqdm.contrib.logging``) and the runner's periodic progress lines
stay quiet.  Without a terminal or without tqdm, those periodic log lines
are all there is (:func:`progress_listeners`).
"""
from __future__ import annotations

import contextlib
import logging
import sys
from typing import Optional

from .base import TrainingListener

__all__ = ["ProgressBar", "progress_listeners"]

logger = logging.getLogger(__name__)


def _tqdm():
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


def progress_listeners(progress="auto") -> list:
    """The progress listeners a trainer adds: ``[ProgressBar()]`` or ``[]``.

    Parameters
    ----------
    progress : {"auto", True, False}
        "auto": a bar when stderr is a terminal and tqdm is installed.
        True: a bar wherever tqdm is installed (else a warning, and log lines).
    """
    if progress not in ("auto", True, False):
        raise ValueError(f"Expect progress in ('auto', True, False), got {progress!r}")
    if progress is False:
        return []
    if _tqdm() is None:
        if progress is True:
            logger.warning("progress=True but tqdm is not installed (pip install tqdm): progress goes to log lines")
        return []
    if progress == "auto":
        stream = sys.stderr
        if stream is None or not getattr(stream, "isatty", lambda: False)():
            return []
    return [ProgressBar()]


class ProgressBar(TrainingListener):
    """Bars of epochs and rounds (tqdm) on stderr.

    Parameters
    ----------
    file : file object, optional
        Where the bars are drawn (default ``sys.stderr``).
    mininterval : float, default 0.1
        Seconds between two redraws at least (tqdm's).
    """

    #: Tells the runner to leave out its periodic progress log lines.
    shows_progress = True

    def __init__(self, file=None, mininterval: float = 0.1):
        tqdm = _tqdm()
        if tqdm is None:
            raise ImportError("ProgressBar needs tqdm: pip install tqdm (or sparkavg[progress])")
        self._tqdm, self.file = tqdm, file
        self._options = {"file": file, "dynamic_ncols": True, "mininterval": mininterval}
        self._epochs = self._rounds = None
        self._redirect: Optional[contextlib.ExitStack] = None

    def on_fit_start(self, trainer, event: dict) -> None:
        self._close()
        self._redirect = contextlib.ExitStack()
        try:
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._redirect.enter_context(logging_redirect_tqdm(tqdm_class=self._tqdm))
        except ImportError:  # an old tqdm: log lines may break the bar, nothing worse
            pass
        self._epochs = self._tqdm(total=event["epochs"], initial=event["epochs_done"], desc="epochs", unit="epoch",
                                  position=0, **self._options)

    def on_round_end(self, trainer, event: dict) -> None:
        if self._rounds is None or self._rounds.total != event["rounds"] or self._rounds.n >= event["round"]:
            if self._rounds is not None:
                self._rounds.close()
            self._rounds = self._tqdm(total=event["rounds"], desc=f"epoch {event['epoch']}", unit="round",
                                      position=1, leave=False, **self._options)
        self._rounds.set_postfix({"loss": f"{event['loss']:.4f}", "ex/s": f"{event['examples_per_second']:.0f}"},
                                 refresh=False)
        self._rounds.update(event["round"] - self._rounds.n)

    def on_epoch_end(self, trainer, event: dict) -> None:
        if self._rounds is not None:
            self._rounds.close()
            self._rounds = None
        if self._epochs is not None:
            post = {"loss": f"{event['loss']:.4f}", "ex/s": f"{event['examples_per_second']:.0f}"}
            if event.get("accuracy") is not None:
                post["acc"] = f"{event['accuracy']:.4f}"
            for key, value in event.items():  # validation values: val_loss, val_<metric> (accuracy as acc)
                if key.startswith("val_") and key != "val_accuracy" and isinstance(value, float):
                    post[key] = f"{value:.4g}"
            self._epochs.set_postfix(post, refresh=False)
            self._epochs.update(1)

    def on_fit_end(self, trainer, event: dict) -> None:
        self._close()

    def on_failure(self, trainer, event: dict) -> None:
        if not event["recovered"]:
            self._close()
        elif self._rounds is not None:  # the epoch trains again from its first round
            self._rounds.close()
            self._rounds = None

    def _close(self) -> None:
        for bar in (self._rounds, self._epochs):
            if bar is not None:
                bar.close()
        self._rounds = self._epochs = None
        if self._redirect is not None:
            self._redirect.close()
            self._redirect = None
