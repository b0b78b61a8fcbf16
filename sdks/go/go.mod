module github.com/deepx-flow/deepx-go

go 1.19
