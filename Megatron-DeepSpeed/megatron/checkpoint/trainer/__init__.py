"""What the training loop calls: the start-up checks of --load and --save (guard), what --load restores, decided
before the engine is built (resume_plan), the save (save, with nested_module: the plain engine's module nested as
upstream's) and the load into a built engine (load)."""
