package sluice_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"maps"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// forbiddenInCore are the import path prefixes an application chooses for itself: the
// OpenTelemetry SDK and its exporters (telemetry/otelsetup), gRPC, the Prometheus client,
// bbolt (the file outbox), and PostgreSQL with watermill-sql (outbox/pgoutbox).
var forbiddenInCore = []string{
	"go.opentelemetry.io/otel/sdk",
	"go.opentelemetry.io/otel/exporters",
	"google.golang.org/grpc",
	"github.com/prometheus/client_golang",
	"go.etcd.io/bbolt",
	"github.com/lib/pq",
	"github.com/jackc/pgx",
	"github.com/ThreeDotsLabs/watermill-sql",
}

// Issue 35: importing router compiled 254 non-standard packages, 66 of them gRPC, because
// router imported telemetry, which built OTLP exporters and a Prometheus registry. The
// core depends on the OpenTelemetry API only; each package below is checked with go list
// -deps, and a failure names the forbidden package and the import chain that reaches it.
func TestCoreDependsOnNoSDKExporterOrDriver(t *testing.T) {
	for _, tc := range []struct {
		pkg    string
		allow  []string // prefixes of forbiddenInCore the package may use
		maxDep int      // non-standard packages at most, sluice's own included
	}{
		{pkg: "./router", maxDep: 100},
		{pkg: "./middleware/...", maxDep: 60},
		{pkg: ".", maxDep: 20},
		{pkg: "./broker/amqp", maxDep: 40},
		{pkg: "./telemetry", maxDep: 80},
		{pkg: "./dlq", maxDep: 50},
		{pkg: "./outbox", allow: []string{"go.etcd.io/bbolt"}, maxDep: 50},
	} {
		t.Run(tc.pkg, func(t *testing.T) {
			graph, roots := depGraph(t, tc.pkg)
			paths := slices.Sorted(maps.Keys(graph))
			var nonStd int
			for _, path := range paths {
				if strings.Contains(strings.SplitN(path, "/", 2)[0], ".") {
					nonStd++
				}
			}
			for _, bad := range forbiddenInCore {
				if slices.Contains(tc.allow, bad) {
					continue
				}
				for _, path := range paths {
					if path == bad || strings.HasPrefix(path, bad+"/") {
						t.Errorf("%s depends on %s: %s", tc.pkg, bad, strings.Join(chainTo(graph, roots, path), " -> "))
						break
					}
				}
			}
			assert.LessOrEqual(t, nonStd, tc.maxDep, "%s depends on %d non-standard packages", tc.pkg, nonStd)
		})
	}
}

// depGraph returns every package pattern depends on, with the imports of each, and the
// packages pattern names, from go list -deps.
func depGraph(t *testing.T, pattern string) (graph map[string][]string, roots []string) {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{.DepOnly}} {{.ImportPath}} {{join .Imports \" \"}}", pattern).CombinedOutput()
	require.NoError(t, err, "go list -deps %s: %s", pattern, out)
	graph = map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		require.GreaterOrEqual(t, len(fields), 2, "go list line %q", line)
		graph[fields[1]] = fields[2:]
		if fields[0] == "false" {
			roots = append(roots, fields[1])
		}
	}
	slices.Sort(roots)
	return graph, roots
}

// chainTo returns an import chain from one of roots to target, the shortest found
// breadth first.
func chainTo(graph map[string][]string, roots []string, target string) []string {
	prev := map[string]string{}
	queue := slices.Clone(roots)
	for _, r := range roots {
		prev[r] = ""
	}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == target {
			var chain []string
			for p := cur; p != ""; p = prev[p] {
				chain = append([]string{p}, chain...)
			}
			return chain
		}
		for _, next := range graph[cur] {
			if _, seen := prev[next]; !seen {
				prev[next] = cur
				queue = append(queue, next)
			}
		}
	}
	return []string{target}
}

// Issue 35: router imported broker/amqp and the embedded broker, and topped its Broker up
// with type assertions, so nobody could write a third broker from its interface. Its
// non-test files now depend on package broker's contract alone: neither broker, nor the
// RabbitMQ membership, is among the packages it compiles.
func TestRouterImportsNoBroker(t *testing.T) {
	graph, roots := depGraph(t, "./router")
	require.Contains(t, graph, "github.com/sluice-go/sluice/broker", "router depends on the broker contract")
	for _, bad := range []string{
		"github.com/sluice-go/sluice/broker/amqp",
		"github.com/sluice-go/sluice/broker/memory",
		"github.com/sluice-go/sluice/internal/membership",
	} {
		if _, ok := graph[bad]; ok {
			t.Errorf("router depends on %s: %s", bad, strings.Join(chainTo(graph, roots, bad), " -> "))
		}
	}
}

// The router asks nothing of a broker beyond the declared capabilities: none of its
// non-test files asserts a concrete type (x.(*T)) or an interface it declares on the spot
// (x.(interface{ ... })).
func TestRouterAssertsNoConcreteBroker(t *testing.T) {
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	dir := filepath.Join(filepath.Dir(file), "router")
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	fset := token.NewFileSet()
	checked := 0
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			ta, ok := n.(*ast.TypeAssertExpr)
			if !ok || ta.Type == nil {
				return true
			}
			switch ta.Type.(type) {
			case *ast.StarExpr, *ast.InterfaceType:
				t.Errorf("%s asserts %s", fset.Position(ta.Pos()), types.ExprString(ta.Type))
			}
			return true
		})
	}
	assert.Greater(t, checked, 5, "router's files were read")
}

// Issue 35: internal/ listed product plumbing and test tooling side by side. Test and
// benchmark tooling live in internal/testkit and internal/benchkit, and no library
// package compiles them.
func TestLibraryCompilesNoTestTooling(t *testing.T) {
	graph, _ := depGraph(t, "./...")
	for pkg, imports := range graph {
		if !strings.HasPrefix(pkg, "github.com/sluice-go/sluice") || isTooling(pkg) {
			continue
		}
		for _, imp := range imports {
			if isTooling(imp) {
				t.Errorf("%s (library code) imports test tooling %s", pkg, imp)
			}
		}
	}
	assert.Contains(t, graph, "github.com/sluice-go/sluice/internal/testkit/testenv", "the tooling is where this test looks")
}

// isTooling says whether pkg is test or benchmark tooling, or a program or test package
// that may use it.
func isTooling(pkg string) bool {
	rel := strings.TrimPrefix(pkg, "github.com/sluice-go/sluice/")
	for _, prefix := range []string{"internal/testkit/", "internal/benchkit/", "test/", "cmd/", "examples/", "tools/"} {
		if strings.HasPrefix(rel, prefix) || rel+"/" == prefix {
			return true
		}
	}
	return false
}
