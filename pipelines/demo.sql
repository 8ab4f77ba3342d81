-- The demo pipeline: `sluice demo` generates data/demo/ and runs this plan.
SET sluice.topic = 'demo';
SET sluice.batch_rows = 512;
SET sluice.epochs = 2;

CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/demo/';

SELECT id, label, text, features, length(text) AS text_len
FROM train
WHERE label IS NOT NULL;
