package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRecord(t *testing.T) {
	now := time.Date(2026, 12, 2, 1, 30, 0, 0, time.UTC)
	table := []byte("| benchmark | metric |\n| --- | --- |\n| X | msgs/s |\n")
	tests := []struct {
		name    string
		doc     string
		want    []string // in the result, in order
		wantErr error
	}{
		{
			name: "first run replaces the placeholder and keeps the text around it",
			doc:  "# Benchmarks\n\nintro\n\n" + recordBegin + "\nNo run recorded yet.\n" + recordEnd + "\n\nafter\n",
			want: []string{"# Benchmarks\n\nintro\n\n" + recordBegin + "\n", "Measured 2026-12-02 01:30 UTC against RabbitMQ 4.3.6", "round(s).\n\n| benchmark | metric |", "| X | msgs/s |\n" + recordEnd + "\n\nafter\n"},
		},
		{
			name: "a later run replaces the earlier table",
			doc:  recordBegin + "\nMeasured earlier\n\n| old |\n" + recordEnd + "\n",
			want: []string{recordBegin + "\n", "| X | msgs/s |\n" + recordEnd + "\n"},
		},
		{name: "no markers", doc: "# Benchmarks\n", wantErr: errNoMarkers},
		{name: "end marker before begin", doc: recordEnd + "\n" + recordBegin + "\n", wantErr: errNoMarkers},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
			require.NoError(t, os.WriteFile(path, []byte(tt.doc), 0o644))
			err := record(path, "", "RabbitMQ 4.3.6", table, 3, now)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				got, rerr := os.ReadFile(path)
				require.NoError(t, rerr)
				assert.Equal(t, tt.doc, string(got), "the file is left as it was")
				return
			}
			require.NoError(t, err)
			got, err := os.ReadFile(path)
			require.NoError(t, err)
			rest := string(got)
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				require.GreaterOrEqual(t, i, 0, "%q not found (in order) in:\n%s", w, got)
				rest = rest[i+len(w):]
			}
			assert.NotContains(t, string(got), "old", "the earlier table is gone")
			assert.NotContains(t, string(got), "No run recorded yet")
			assert.Equal(t, 1, strings.Count(string(got), "Measured 2026"), "one heading")
		})
	}
}

func TestRecordMissingFile(t *testing.T) {
	err := record(filepath.Join(t.TempDir(), "absent.md"), "", "RabbitMQ 4.3.6", []byte("| x |"), 1, time.Now())
	require.ErrorIs(t, err, os.ErrNotExist)
}

// Each broker version has its own section: recording one leaves the other's table alone.
func TestRecordSection(t *testing.T) {
	b43, e43 := markers("RabbitMQ 4.3")
	b310, e310 := markers("RabbitMQ 3.10")
	doc := b43 + "\nNo run recorded yet.\n" + e43 + "\n" + b310 + "\nMeasured earlier against RabbitMQ 3.10.8\n\n| old 3.10 |\n" + e310 + "\n"
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o644))
	table := []byte("| X | msgs/s |\n")
	require.NoError(t, record(path, "RabbitMQ 4.3", "RabbitMQ 4.3.6", table, 1, time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(got), b43+"\nMeasured 2026-12-04 09:00 UTC against RabbitMQ 4.3.6")
	assert.Contains(t, string(got), "| old 3.10 |", "the 3.10 table is kept")
	assert.NotContains(t, string(got), "No run recorded yet")
	err = record(path, "RabbitMQ 4.0", "RabbitMQ 4.0.9", table, 1, time.Now())
	require.ErrorIs(t, err, errNoMarkers)
	assert.Contains(t, err.Error(), "benchtable:begin RabbitMQ 4.0")
}
