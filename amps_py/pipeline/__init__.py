"""The data pipeline over journals: a PySpark data source, Parquet export, the fabric
audit and topic statistics.

Nothing here is imported by the server: pyspark and pyarrow are optional extras
(``pip install -e '.[spark]'``). :mod:`.schema` turns journal records into Arrow
columns (pyarrow only, no Spark); :mod:`.spark` builds the Spark session with quiet,
offline-safe defaults. Export runs without Java; the Spark jobs read its Parquet or
the ``amps_txlog`` data source.
"""
