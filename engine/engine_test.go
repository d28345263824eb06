package engine

import (
	"slices"
	"testing"
)

func TestRuns(t *testing.T) {
	for _, tc := range []struct {
		name       string
		partitions []int
		want       [][2]int
	}{
		{"empty", nil, nil},
		{"one", []int{3}, [][2]int{{0, 1}}},
		{"one run", []int{2, 2, 2}, [][2]int{{0, 3}}},
		{"alternating", []int{0, 1, 0}, [][2]int{{0, 1}, {1, 2}, {2, 3}}},
		{"runs", []int{1, 1, 0, 0, 0, 1}, [][2]int{{0, 2}, {2, 5}, {5, 6}}},
	} {
		var got [][2]int
		for start, end := range Runs(tc.partitions) {
			got = append(got, [2]int{start, end})
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: Runs(%v) = %v, want %v", tc.name, tc.partitions, got, tc.want)
		}
	}
	for start := range Runs([]int{0, 1, 2}) { // stopping early stops
		if start > 0 {
			t.Fatal("Runs went on after the loop broke")
		}
		break
	}
}
