"""Training the way people train: validation metrics every epoch, early
stopping, the best epoch, and the history a fit returns::

    from sparkavg.spark import EarlyStopping, SparkTrainer
    history = trainer.fit(df, epochs=50, validation_data=val_df, metrics=["auc"],
                          early_stopping=EarlyStopping(monitor="val_loss", patience=3))
    history.best_epoch, history.metric("val_auc"), history.stop_reason

Driver-side and Spark-free; the trainer (:mod:`sparkavg.spark.trainer`)
calls :class:`~sparkavg.fitting.tracker.FitTracker` at every epoch end.
"""
from .early_stopping import STOP_REASONS, EarlyStopping, Monitor
from .history import History
from .metrics import METRICS, ValidationPlan, monitor_names

__all__ = ["EarlyStopping", "History", "Monitor", "ValidationPlan", "METRICS", "STOP_REASONS", "monitor_names"]
