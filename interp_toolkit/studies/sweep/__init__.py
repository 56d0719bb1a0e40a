"""Planning and running a sweep: jobs, the local pool or Ray, resources and progress."""
