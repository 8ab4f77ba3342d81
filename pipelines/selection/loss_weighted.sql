-- Loss-weighted sampling without replacement: 20 000 samples a round, each drawn with
-- probability rising with the mean loss reported for it (unreported samples weigh as
-- much as the worst reported one). A round starts when the trainers' mean loss over the
-- last round exceeds 0.7: a drift rule written as a query.
SET sluice.topic = 'loss_weighted';
SET sluice.batch_rows = 512;
SET sluice.rounds = 10;
SET sluice.trigger = 'sql:SELECT avg(loss) > 0.7 FROM sluice_feedback WHERE round = sluice_round()';
SET sluice.feedback = 'loss';
SET sluice.shuffle_seed = 7;

CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/demo/';

SELECT t.id, t.label, t.features
FROM train t
LEFT JOIN (SELECT key, avg(loss) AS loss FROM sluice_feedback GROUP BY key) f
  ON t.id = f.key
CROSS JOIN (SELECT coalesce(max(loss), 1.0) AS worst FROM sluice_feedback) w
WHERE t.label IS NOT NULL
ORDER BY sample_weighted(coalesce(f.loss, w.worst), t.id) DESC NULLS LAST
LIMIT 20000;
