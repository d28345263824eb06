package main

import (
	"sync"
)

// chanPeer is the baseline: buffered Go channels (1024), no library at all.
//
// Mapping: one channel per (group, partition), read by one goroutine.
//   - S1: one channel.
//   - S2: the producer sends each message to the 4 groups' channels in turn.
//     It sends the same slice to all four rather than a copy per channel:
//     the consumers only read it, and a copy per consumer would charge the
//     baseline with work that plain channels do not need. logbus's bytes
//     codec does copy per group (its Decode must not alias the stored
//     record), so this makes the baseline a lower bound, not a like-for-like.
//   - S3: producer p sends to channel p, read by consumer p.
//
// There is no ack: a message received is a message done.
//
// chan-batch (batch > 1) sends slices of up to batch messages instead, the
// channel's own way of batching, with channels of 1024/batch slots so that
// as many messages can be in flight.
type chanPeer struct{ batch int }

func (p chanPeer) name() string {
	if p.batch > 1 {
		return "chan-batch"
	}
	return "chan"
}

func (p chanPeer) run(sc scenario, n int) (result, error) {
	if p.batch > 1 {
		return p.runBatches(sc, n)
	}
	stamp := sc.pace > 0
	tr := newTracker(n, sc.groups, stamp)
	chans := make([][]chan []byte, sc.groups) // [group][partition]
	var consumers sync.WaitGroup
	for g := range sc.groups {
		chans[g] = make([]chan []byte, sc.partitions)
		for part := range sc.partitions {
			ch := make(chan []byte, 1024)
			chans[g][part] = ch
			// Ends when the channel is closed after the producers finish.
			consumers.Go(func() {
				for p := range ch {
					tr.deliver(g, p)
				}
			})
		}
	}

	var res result
	m := startMeter()
	err := runProducers(sc, n, func(p int, seq uint64) error {
		// A fresh slice per message: the consumer holds on to it, so the
		// producer cannot reuse a buffer.
		b := newPayload(seq, stamp)
		part := p % sc.partitions
		for g := range sc.groups {
			chans[g][part] <- b
		}
		return nil
	})
	if err == nil {
		err = tr.wait(*flagTimeout)
	}
	m.stop(&res)

	for g := range chans {
		for _, ch := range chans[g] {
			close(ch)
		}
	}
	consumers.Wait()
	tr.finish(&res)
	return res, err
}

func (p chanPeer) runBatches(sc scenario, n int) (result, error) {
	stamp := sc.pace > 0
	tr := newTracker(n, sc.groups, stamp)
	chans := make([][]chan [][]byte, sc.groups) // [group][partition]
	var consumers sync.WaitGroup
	for g := range sc.groups {
		chans[g] = make([]chan [][]byte, sc.partitions)
		for part := range sc.partitions {
			ch := make(chan [][]byte, 1024/p.batch)
			chans[g][part] = ch
			// Ends when the channel is closed after the producers finish.
			consumers.Go(func() {
				for batch := range ch {
					for _, m := range batch {
						tr.deliver(g, m)
					}
				}
			})
		}
	}

	var res result
	m := startMeter()
	err := runProducerBatches(sc, n, p.batch, func(prod int, first uint64, count int) error {
		// Fresh slices: the consumers hold on to them.
		batch := make([][]byte, count)
		for i := range batch {
			batch[i] = newPayload(first+uint64(i), stamp)
		}
		part := prod % sc.partitions
		for g := range sc.groups {
			chans[g][part] <- batch
		}
		return nil
	})
	if err == nil {
		err = tr.wait(*flagTimeout)
	}
	m.stop(&res)

	for g := range chans {
		for _, ch := range chans[g] {
			close(ch)
		}
	}
	consumers.Wait()
	tr.finish(&res)
	return res, err
}
