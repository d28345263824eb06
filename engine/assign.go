package engine

// Assign deals partitions 0..partitions-1 out to members (in join order)
// and returns the owner of each partition ("" when there are no members).
// Every engine deals a group's partitions with it, so a group is dealt
// alike whatever the engine, and brokers that share a group (a
// distributed engine) compute the same deal from the same input.
//
// It is sticky: a partition stays with its previous owner while that owner is
// still a member and under its fair share, so a join or a leave moves only as
// many partitions as balance requires, and the partitions that do not move
// are not disturbed. Shares differ by at most one; with more members than
// partitions the members that joined last stay idle. With no previous owners
// the result is partition i → member i mod n.
//
// It is pure: same input, same output.
func Assign(members []string, partitions int, prev []string) []string {
	owners := make([]string, partitions)
	n := len(members)
	if n == 0 {
		return owners
	}
	fair, bigShares := partitions/n, partitions%n // bigShares members may own fair+1
	counts := make(map[string]int, n)
	for _, m := range members {
		counts[m] = 0
	}
	// canTake reports whether m may own one more partition, and books the
	// extra share when taking one would use it.
	canTake := func(m string) bool {
		switch c := counts[m]; {
		case c < fair:
			return true
		case c == fair && bigShares > 0:
			bigShares--
			return true
		}
		return false
	}
	var homeless []int
	for p := range partitions {
		if p < len(prev) {
			if _, member := counts[prev[p]]; member && canTake(prev[p]) {
				owners[p] = prev[p]
				counts[prev[p]]++
				continue
			}
		}
		homeless = append(homeless, p)
	}
	for _, p := range homeless {
		best := ""
		for _, m := range members { // join order breaks ties
			if best == "" || counts[m] < counts[best] {
				best = m
			}
		}
		// The least loaded member can always take one more: the shares add
		// up to the partition count.
		if !canTake(best) {
			panic("logbus: assign: no member can take a partition")
		}
		owners[p] = best
		counts[best]++
	}
	return owners
}
