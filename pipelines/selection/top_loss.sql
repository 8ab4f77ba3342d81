-- Top-k by loss (Modyn's loss-based downsampling): each round trains on the 20 000
-- samples with the highest loss any trainer reported, samples nobody has reported yet
-- (new ones) first. A round starts once 10 000 new rows have arrived.
--
-- The choice is made once per round: `CREATE TABLE … AS` runs when the round is planned
-- (a trigger's looks leave it alone), and each of the round's three epochs reads the
-- chosen rows without sorting the data again.
SET sluice.topic = 'top_loss';
SET sluice.batch_rows = 512;
SET sluice.rounds = 10;
SET sluice.epochs = 3;
SET sluice.trigger = 'rows:10000';
SET sluice.feedback = 'loss';

CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/demo/';

CREATE TABLE chosen AS
SELECT t.id, f.loss
FROM train t
LEFT JOIN (SELECT key, max(loss) AS loss FROM sluice_feedback GROUP BY key) f
  ON t.id = f.key
WHERE t.label IS NOT NULL
ORDER BY f.loss DESC NULLS FIRST, t.id
LIMIT 20000;

SELECT t.id, t.label, t.features
FROM train t
JOIN chosen c ON t.id = c.id
ORDER BY c.loss DESC NULLS FIRST, t.id;
