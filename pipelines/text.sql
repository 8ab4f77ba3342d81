-- Text: tokenize with a Hugging Face tokenizer file, truncate and pad to 16 tokens.
-- Runs over the default demo dataset (`sluice demo --prepare-only` writes data/demo/).
SET sluice.topic = 'text';
SET sluice.batch_rows = 256;

CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/demo/';

SELECT id,
       tok['input_ids'] AS input_ids,             -- int64 [16], padded with [PAD]
       tok['attention_mask'] AS attention_mask,   -- int8 [16], 1 for real tokens
       one_hot(label, 10) AS target
FROM (SELECT id, label, tokenize(text, 'pipelines/tokenizer.json', 16) AS tok
      FROM train WHERE label IS NOT NULL);
