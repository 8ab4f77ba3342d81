-- Label-balanced presampling: at most 1 000 samples of each label per round, drawn
-- afresh each round from (sluice.shuffle_seed, round, id). A round starts every 10 minutes.
SET sluice.topic = 'label_balanced';
SET sluice.batch_rows = 512;
SET sluice.rounds = 10;
SET sluice.trigger = 'every:10m';
SET sluice.shuffle_seed = 7;
-- The join below builds its table from the ten per-label cuts and streams the scan
-- through it, instead of hash-partitioning every whole row first.
SET datafusion.optimizer.repartition_joins = false;

CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/demo/';

-- Each label's cut is its 1 000th smallest draw (sample_cut reads the narrow columns
-- only), so the rows at or under it are exactly the 1 000 that
-- ROW_NUMBER() OVER (PARTITION BY label ORDER BY sample_hash(id)) <= 1000 would keep,
-- and they stream from the scan once the cuts are made (docs/rounds.md, "Costs").
SELECT t.id, t.label, t.features
FROM (
  SELECT label, sample_cut(sample_hash(id), 1000) AS cut
  FROM train
  WHERE label IS NOT NULL
  GROUP BY label) c
JOIN train t ON t.label = c.label
WHERE sample_hash(t.id) <= c.cut;
