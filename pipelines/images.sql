-- Image classification: decode JPEG/PNG bytes of any size, resize, random crop, random
-- horizontal flip, normalize with the ImageNet statistics, channels first.
-- `sluice demo --images` generates data/images/ and runs this plan.
SET sluice.topic = 'images';
SET sluice.batch_rows = 128;
SET sluice.epochs = 2;
SET sluice.shuffle_seed = 7;          -- also seeds random_crop / random_flip (per epoch, per id)

CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION 'data/images/';

SELECT id,
       to_chw(normalize(
         random_flip(random_crop(resize(decode_image(image), 72, 72), 64, 64, id), id),
         make_array(0.485, 0.456, 0.406),
         make_array(0.229, 0.224, 0.225))) AS pixels,   -- float32 [3, 64, 64]
       one_hot(label, 10) AS target                    -- float32 [10]
FROM train;
