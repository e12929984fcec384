"""Files on disk: writing without half-written results (atomic), flushing and naming why a write failed
(storage), reading the JSON and text files a user hands us (user_json), and one run per --save (save_dir_lock)."""
