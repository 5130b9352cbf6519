"""The course: course.yaml and the folder it lives in, and the data grading reads (MNIST)."""
