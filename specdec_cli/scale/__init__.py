"""Running past one process: `ray_batch` spreads a batch over Ray actors (`specdec batch --ray`)."""
