package engine

import (
	"slices"
	"testing"
)

func TestAssign(t *testing.T) {
	tests := []struct {
		name       string
		members    []string
		partitions int
		prev       []string
		want       []string
	}{
		{"no members", nil, 3, nil, []string{"", "", ""}},
		{"fresh is i mod n", []string{"a", "b"}, 5, nil, []string{"a", "b", "a", "b", "a"}},
		{"more members than partitions", []string{"a", "b", "c"}, 2, nil, []string{"a", "b"}},
		{"join moves only what balance needs", []string{"a", "b"}, 4,
			[]string{"a", "a", "a", "a"}, []string{"a", "a", "b", "b"}},
		{"leave keeps the others' partitions", []string{"a", "c"}, 6,
			[]string{"a", "b", "c", "a", "b", "c"}, []string{"a", "a", "c", "a", "c", "c"}},
		{"stable when nothing changes", []string{"a", "b"}, 4,
			[]string{"b", "a", "b", "a"}, []string{"b", "a", "b", "a"}},
		{"third member takes one from each", []string{"a", "b", "c"}, 6,
			[]string{"a", "b", "a", "b", "a", "b"}, []string{"a", "b", "a", "b", "c", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Assign(tt.members, tt.partitions, tt.prev)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Assign(%v, %d, %v) = %v, want %v", tt.members, tt.partitions, tt.prev, got, tt.want)
			}
		})
	}
}

// TestAssignBalanced checks the shares on every small shape: they differ by
// at most one and cover every partition.
func TestAssignBalanced(t *testing.T) {
	all := []string{"a", "b", "c", "d", "e"}
	for n := 1; n <= len(all); n++ {
		for parts := 0; parts <= 9; parts++ {
			prev := Assign(all[:max(1, n-1)], parts, nil) // as if one member just joined
			got := Assign(all[:n], parts, prev)
			counts := map[string]int{}
			for p, o := range got {
				if o == "" {
					t.Fatalf("n=%d parts=%d: partition %d unowned", n, parts, p)
				}
				counts[o]++
			}
			lo, hi := parts, 0
			for _, m := range all[:n] {
				lo, hi = min(lo, counts[m]), max(hi, counts[m])
			}
			if hi-lo > 1 {
				t.Errorf("n=%d parts=%d: shares %v differ by more than one", n, parts, counts)
			}
		}
	}
}
