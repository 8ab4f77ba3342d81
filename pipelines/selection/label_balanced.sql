-- Label-balanced presampling: at most 1 000 samples of each label per round, drawn
-- afresh each round from (sluice.shuffle_seed, round, id). A round starts every 10 minutes.
SET sluice.topic = 'label_balanced';
SET sluice.batch_rows = 512;
SET sluice.rounds = 10;
SET sluice.trigger = 'every:10m';
SET sluice.shuffle_seed = 7;

CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/demo/';

-- The draw reads the narrow columns only, and its ids come first in the join, so the
-- round's rows stream from the scan once the draw is made (docs/rounds.md, "Costs").
SELECT t.id, t.label, t.features
FROM (
  SELECT id
  FROM (
    SELECT id,
           ROW_NUMBER() OVER (PARTITION BY label ORDER BY sample_hash(id)) AS drawn
    FROM train
    WHERE label IS NOT NULL)
  WHERE drawn <= 1000) chosen
JOIN train t ON t.id = chosen.id;
