"""Running past one process: `ray_batch` spreads a batch over Ray actors (`specdec batch --ray`);
`serve_fleet` runs the server's app as replicas on Ray Serve (`specdec serve --replicas N`)."""
