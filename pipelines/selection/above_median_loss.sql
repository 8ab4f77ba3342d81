-- Streaming loss-based selection: every sample nobody has reported yet (new ones), and
-- the reported ones whose highest loss is at or above the median of all reported losses.
-- The median is computed first, then the scan is filtered as it goes: no sort of the
-- data, so the round's first batch comes sooner than top_loss.sql's (docs/rounds.md,
-- "Costs"). A round starts once 10 000 new rows have arrived.
SET sluice.topic = 'above_median_loss';
SET sluice.batch_rows = 512;
SET sluice.rounds = 10;
SET sluice.trigger = 'rows:10000';
SET sluice.feedback = 'loss';

CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/demo/';

SELECT t.id, t.label, t.features
FROM train t
LEFT JOIN (SELECT key, max(loss) AS loss FROM sluice_feedback GROUP BY key) f ON t.id = f.key
CROSS JOIN (SELECT median(loss) AS cut
            FROM (SELECT max(loss) AS loss FROM sluice_feedback GROUP BY key)) c
WHERE t.label IS NOT NULL
  AND (f.loss IS NULL OR f.loss >= c.cut);
