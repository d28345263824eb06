package core

// redriving is how many redriven dead letters wait on gp.
func (gp *groupPartition) redriving() int { return 0 }
