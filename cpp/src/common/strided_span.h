// StridedSpan<T>: a read view of n objects of type T spaced `stride` bytes apart, e.g. one member
// of every element of an array of larger structs. It lets one row type flow from the scheduler to
// the device: the model reads the ForwardRow inside each of the scheduler's StepRows in place,
// without copying them into a second array.
#pragma once

#include <cstddef>
#include <iterator>
#include <span>
#include <type_traits>

namespace deepinfer {

template <typename T>
class StridedSpan {
 public:
  StridedSpan() = default;
  // A contiguous array of T.
  StridedSpan(std::span<T> items)  // NOLINT(google-explicit-constructor): a span is a view too
      : base_(reinterpret_cast<Byte*>(items.data())), size_(items.size()), stride_(sizeof(T)) {}
  // Any contiguous range of T (a vector, an array).
  template <typename Range>
  requires std::is_constructible_v<std::span<T>, Range&> StridedSpan(
      Range& items)  // NOLINT(google-explicit-constructor)
      : StridedSpan(std::span<T>(items)) {}
  // Member `member` of every element of `outer`.
  template <typename Outer, typename Class, typename Member>
  StridedSpan(std::span<Outer> outer, Member Class::*member)
      : base_(outer.empty() ? nullptr : reinterpret_cast<Byte*>(&(outer.data()->*member))),
        size_(outer.size()),
        stride_(sizeof(Outer)) {
    static_assert(std::is_same_v<std::remove_cv_t<Outer>, Class>);
    static_assert(std::is_same_v<std::remove_cv_t<T>, Member>);
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) const { return *reinterpret_cast<T*>(base_ + i * stride_); }
  T& front() const { return (*this)[0]; }
  T& back() const { return (*this)[size_ - 1]; }

  class iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = std::remove_cv_t<T>;
    using difference_type = std::ptrdiff_t;
    using pointer = T*;
    using reference = T&;
    iterator() = default;
    iterator(const StridedSpan* span, size_t index) : span_(span), index_(index) {}
    T& operator*() const { return (*span_)[index_]; }
    T* operator->() const { return &(*span_)[index_]; }
    iterator& operator++() {
      ++index_;
      return *this;
    }
    iterator operator++(int) {
      iterator before = *this;
      ++index_;
      return before;
    }
    bool operator==(const iterator& other) const { return index_ == other.index_; }

   private:
    const StridedSpan* span_ = nullptr;
    size_t index_ = 0;
  };
  iterator begin() const { return iterator(this, 0); }
  iterator end() const { return iterator(this, size_); }

 private:
  using Byte = std::conditional_t<std::is_const_v<T>, const std::byte, std::byte>;
  Byte* base_ = nullptr;
  size_t size_ = 0;
  size_t stride_ = sizeof(T);
};

}  // namespace deepinfer
