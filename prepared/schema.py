"""The prepared-dataset contract: directory layout, column names and the manifest's schema version.

Every later stage (training, scoring, evaluation) and outside tools read a prepared directory
through these names. Bump ``SCHEMA_VERSION`` on any incompatible change.

    DIR/manifest.json   written last; names every file with its size ("files"): the directory is
                        complete when it holds the manifest and exactly those files
    DIR/items/          Parquet, one row per item:  item_index int32, item_id string,
                        pop_train int64, pop_train_valid int64          (sorted by item_index)
    DIR/users/          Parquet, one row per user:  user_index int32, user_id string, cold bool
                        (sorted by user_index, within each file and across the files in name
                        order: a range of users per file, etl.write.write_users)
    DIR/rows/           Parquet shards, one row per user (within a shard by xxhash64 of user_id):
                        user_index int32, user_id string, cold bool,
                        train_items list<int32> (ascending), train_rstar list<float32> (aligned),
                        valid_items list<int32>, test_items list<int32>,
                        neg_items list<int32> (ascending), neg_counts list<int32> (aligned)
    DIR/split/          Parquet, one row per positive with raw ids:
                        user_id string, item_id string, split string (train|valid|test),
                        timestamp int64 (unix seconds; null when the source has no time)

Cold users have train items (their fold-in input) but no negatives; their R* values are computed
like everyone's but are not used for training.
"""

SCHEMA_VERSION = 2  # 2: the manifest lists every file with its size (runtime/publish.py, prepared/files.py)

MANIFEST = "manifest.json"
ITEMS_DIR = "items"
USERS_DIR = "users"
ROWS_DIR = "rows"
SPLIT_DIR = "split"

USER_INDEX, USER_ID, COLD = "user_index", "user_id", "cold"
ITEM_INDEX, ITEM_ID = "item_index", "item_id"
POP_TRAIN, POP_TRAIN_VALID = "pop_train", "pop_train_valid"
TRAIN_ITEMS, TRAIN_RSTAR = "train_items", "train_rstar"
VALID_ITEMS, TEST_ITEMS = "valid_items", "test_items"
NEG_ITEMS, NEG_COUNTS = "neg_items", "neg_counts"
SPLIT, TIMESTAMP = "split", "timestamp"

ROW_COLUMNS = (USER_INDEX, USER_ID, COLD, TRAIN_ITEMS, TRAIN_RSTAR, VALID_ITEMS, TEST_ITEMS,
               NEG_ITEMS, NEG_COUNTS)
SPLITS = ("train", "valid", "test")
