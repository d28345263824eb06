package pubsub_test

import "runtime"

func benchProcs() int { return runtime.GOMAXPROCS(0) }
