"""Code that runs inside Spark's Python workers.

- :mod:`.context`: the cached network, shipped state, plain result records;
- :mod:`.minibatches`: a task's minibatches, prefetched and recorded;
- :mod:`.averaging`: one parameter-averaging round;
- :mod:`.sharing`: one gradient-sharing epoch (barrier task over UDP);
- :mod:`.inference`: evaluation, scoring, prediction;
- :mod:`.device`: the task's Spark-assigned GPU or the CPU, and why;
- :mod:`.arrow`: DataFrame columns to numpy (vectorised, both flavours);
- :mod:`.codec`, :mod:`.adapters`: results as JSON + bytes and the tasks
  inside Spark Connect's ``mapInArrow``;
- :mod:`.hooks`: the tests' fault injection (off in production).

Task factories close over plain values only -- never a SparkContext or a
trainer -- and turn errors retrying cannot fix into results
(:mod:`sparkavg.spark.errors`).
"""
