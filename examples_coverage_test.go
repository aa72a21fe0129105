package sluice_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// notLibrary are the module's top directories that hold no package a user imports:
// internal packages, commands, example services, test and tool code, sample handlers.
var notLibrary = []string{"internal", "cmd", "examples", "test", "tools", "handlers"}

// Issue 56: "every public package has an Example". A public package is a directory outside
// notLibrary, internal directories, testdata and hidden directories, with a non-test Go file of a
// package other than main; its Example is a func Example or ExampleX in one of its
// _test.go files. Files are parsed, not built, so the check needs no broker.
func TestEveryPublicPackageHasAnExample(t *testing.T) {
	pkgs := publicPackages(t)
	require.Contains(t, pkgs, ".", "the module root is a public package")
	for _, dir := range pkgs {
		t.Run(dir, func(t *testing.T) {
			assert.NotEmpty(t, examplesIn(t, dir), "package ./%s has no Example: add one in its example_test.go, ending with a checked // Output: where the output is deterministic", dir)
		})
	}
}

// publicPackages returns the directories, from the module root, of the public packages.
func publicPackages(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
			return filepath.SkipDir
		}
		if top, _, _ := strings.Cut(filepath.ToSlash(path), "/"); slices.Contains(notLibrary, top) || name == "internal" {
			return filepath.SkipDir // internal at any depth: the go command lets no user import it
		}
		if path != "." {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		}
		if isLibraryPackage(t, path) {
			dirs = append(dirs, filepath.ToSlash(path))
		}
		return nil
	})
	require.NoError(t, err)
	return dirs
}

// isLibraryPackage reports whether dir holds a non-test Go file of a package other than main.
func isLibraryPackage(t *testing.T, dir string) bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly)
		require.NoError(t, err)
		if file.Name.Name != "main" {
			return true
		}
	}
	return false
}

// examplesIn returns the names of the Example functions of dir's _test.go files.
func examplesIn(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	require.NoError(t, err)
	var names []string
	for _, f := range files {
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, decl := range file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if ok && fn.Recv == nil && isExampleName(fn.Name.Name) && fn.Type.Params.NumFields() == 0 && fn.Type.Results.NumFields() == 0 {
				names = append(names, fn.Name.Name)
			}
		}
	}
	return names
}

// isExampleName reports whether name is one go test runs as an example: Example, or
// Example followed by a name that does not start with a lower-case letter (ExampleX,
// Example_suffix).
func isExampleName(name string) bool {
	rest, ok := strings.CutPrefix(name, "Example")
	if !ok {
		return false
	}
	return rest == "" || rest[0] < 'a' || rest[0] > 'z'
}
