"""What every process of a run shares, driver and workers alike: stop signals, watching the process that started
it, and freezing the heap after set-up."""
