-- New data only: each round trains on the samples no trainer has reported on yet (the
-- ones that arrived since). A round starts once 5 000 new rows have arrived.
SET sluice.topic = 'unseen_only';
SET sluice.batch_rows = 512;
SET sluice.rounds = 10;
SET sluice.trigger = 'rows:5000';

CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/demo/';

SELECT t.id, t.label, t.features
FROM train t
WHERE t.label IS NOT NULL
  AND t.id NOT IN (SELECT key FROM sluice_feedback);
