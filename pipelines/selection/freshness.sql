-- Freshness: every sample no trainer has trained on yet, plus a fifth of the others,
-- redrawn each round (a replay buffer against forgetting). A round starts when a trainer
-- asks (sluice.request_round in Python) once it has evaluated the last one.
SET sluice.topic = 'freshness';
SET sluice.batch_rows = 512;
SET sluice.rounds = 10;
SET sluice.trigger = 'manual';
SET sluice.shuffle_seed = 7;

CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/demo/';

SELECT t.id, t.label, t.features
FROM train t
LEFT JOIN (SELECT DISTINCT key FROM sluice_feedback) seen ON t.id = seen.key
WHERE t.label IS NOT NULL
  AND (seen.key IS NULL OR sample_hash(t.id) < 0.2);
